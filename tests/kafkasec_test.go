package tests

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/internal/testutil/testcerts"
	"github.com/outboxd/outboxd/outbox"
)

// The exactly-once kill -9 test over TLS and SCRAM-SHA-512, with ACLs that
// grant outboxd's user exactly what the ACL table of docs/kafka.md lists: every line's
// output is on ledger.out once, every malformed line on ledger.dlq once,
// balances in order, however often the server died.
func TestKafkaSec_KillNine(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 12))
	lf := makeLedger(rng, 50_000)
	b := startSASLBroker(t, kafkasec.MechanismSCRAMSHA512, ledgerGrants("")...)
	killRun(t, rng, lf, 15, append(b.serverArgs(t, serverSecret), "--outbox-retention", "0")...)
	checkTopicsWith(t, b.addr, b.adminOpts(t), lf, 0)
}

// Every client connects with the one set of settings: over TLS with PLAIN,
// and over mutual TLS, `server produce` writes a topic, a Kafka feed reads
// it (committing its group's offsets), the relay publishes the outputs of
// that feed and of a file feed, `server consume` reads them back; the API
// answers over TLS.
func TestKafkaSec_AllClients(t *testing.T) {
	t.Run("PLAIN", func(t *testing.T) {
		w, r, c := kmsg.ACLOperationWrite, kmsg.ACLOperationRead, kmsg.ACLOperationCreate
		grants := append(ledgerGrants(""), topicACL("in", false, r, w)...) // Write: `server produce` as outboxd
		grants = append(grants, topicACL("in.", true, w, c, r)...)         // in.out, in.dlq; Read for `consume`
		grants = append(grants, acls(kmsg.ACLResourceTypeGroup, "outboxd-in", false, r)...)
		b := startSASLBroker(t, kafkasec.MechanismPlain, grants...)
		allClients(t, b)
	})
	t.Run("MutualTLS", func(t *testing.T) {
		allClients(t, startMutualTLSBroker(t))
	})
}

func allClients(t *testing.T, b *secureBroker) {
	t.Helper()
	if _, err := b.admin.CreateTopics(context.Background(), 2, 1, nil, "in"); err != nil {
		t.Fatal(err)
	}
	sec := b.serverArgs(t, serverSecret)
	var lines strings.Builder
	for i := range 300 {
		fmt.Fprintf(&lines, "k%d,line %d\n", i%10, i)
	}
	if out, errOut, code := tool(t, lines.String(), append([]string{"produce", "--topic", "in", "--key-field", "1"}, sec...)...); code != 0 {
		t.Fatalf("produce: exit %d: %s %s", code, out, errOut)
	}
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	if err := os.WriteFile(input, []byte("alice,10\nbob,5\nnot a line\nalice,-3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	apiCert, err := b.ca.Server("api")
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "outboxd.db")
	p := start(t, nil, append([]string{"--db", db, "--http", "127.0.0.1:0",
		"--http-tls-cert", apiCert.CertFile, "--http-tls-key", apiCert.KeyFile,
		"--feed", "ledger=file:" + input, "--processor", "ledger=ledger",
		"--feed", "in=kafka:in"}, sec...)...)
	base := "https://" + httpAddr(t, p)
	cl := httpsClient(b.ca)
	wait(t, 60*time.Second, func() error {
		var fs feedState
		if err := getWith(cl, base+"/feeds/in/status", &fs); err != nil {
			return err
		}
		var os outboxState
		if err := getWith(cl, base+"/outbox/status", &os); err != nil {
			return err
		}
		if fs.Position != 300 || os.Pending != 0 || os.Relay.State != "idle" {
			return fmt.Errorf("feed in at %d (%s %q), outbox pending %d, relay %s %q", fs.Position, fs.State, fs.LastError,
				os.Pending, os.Relay.State, os.Relay.LastError)
		}
		return nil
	})
	if !strings.Contains(p.log.String(), "kafka_security=") {
		t.Fatal("the start-up line does not say how the server connects to Kafka")
	}
	out, errOut, code := tool(t, "", append([]string{"consume", "--topic", "in.out", "--from-beginning", "--until-end",
		"--format", "json"}, sec...)...)
	if code != 0 || !strings.Contains(errOut, "300 records") {
		t.Fatalf("consume in.out: exit %d: %q", code, errOut)
	}
	seen := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct{ Value *string }
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Value == nil {
			t.Fatalf("consume line %q: %v", line, err)
		}
		seen[*r.Value]++
	}
	for i := range 300 {
		if v := fmt.Sprintf("k%d,line %d", i%10, i); seen[v] != 1 {
			t.Fatalf("consume in.out: %q seen %d times, want once", v, seen[v])
		}
	}
	// The group's offsets follow the store.
	wait(t, 30*time.Second, func() error {
		offs, err := b.admin.FetchOffsets(context.Background(), "outboxd-in")
		if err != nil {
			return err
		}
		var sum int64
		offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
		if sum != 300 {
			return fmt.Errorf("group offsets sum to %d, want 300", sum)
		}
		return nil
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	got := readAllWith(t, b.addr, b.adminOpts(t), "ledger.out", "ledger.dlq")
	if len(got["ledger.out"]) != 3 || len(got["ledger.dlq"]) != 1 {
		t.Fatalf("ledger.out %d records, ledger.dlq %d, want 3 and 1", len(got["ledger.out"]), len(got["ledger.dlq"]))
	}
}

// Each grant outboxd lacks is one clear error: the relay's state says
// unauthorized (or the feed's state stalled), the error names the
// principal, the operation and the resource, one log line says so, and
// once an operator grants it, everything goes out exactly once, with no
// restart.
func TestKafkaSec_MissingACL(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	lf := makeLedger(rng, 2_000)
	run := func(t *testing.T, b *secureBroker, db string) (*proc, string) {
		t.Helper()
		input := filepath.Join(filepath.Dir(db), "ledger.csv")
		if err := os.WriteFile(input, lf.data, 0o644); err != nil {
			t.Fatal(err)
		}
		p := start(t, nil, append(ledgerArgs(db, input, "--http", "127.0.0.1:0"), b.serverArgs(t, serverSecret)...)...)
		return p, "http://" + httpAddr(t, p)
	}
	cases := []struct {
		name, skip, want string
		grant            *kadm.ACLBuilder
	}{
		{"OutputTopic", "outputs", `not authorized: User:outboxd lacks Write on topic "ledger.`,
			kadm.NewACLs().Topics("ledger.").ResourcePatternType(kadm.ACLPatternPrefixed).Operations(kadm.OpWrite, kadm.OpCreate)},
		{"TransactionalID", "txn", `not authorized: User:outboxd lacks Write on transactional id "outboxd-`,
			kadm.NewACLs().TransactionalIDs("outboxd-").ResourcePatternType(kadm.ACLPatternPrefixed).Operations(kadm.OpWrite)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := startSASLBroker(t, kafkasec.MechanismSCRAMSHA256, ledgerGrants(c.skip)...)
			db := filepath.Join(t.TempDir(), "outboxd.db")
			p, base := run(t, b, db)
			waitRelay(t, base, "unauthorized", c.want)
			refusedOnce(t, p, b, "Kafka refused the relay")
			b.grant(t, c.grant)
			waitPublished(t, db, int64(len(lf.data)))
			if code := p.stop(t, 30*time.Second); code != 0 {
				t.Fatalf("exit code %d", code)
			}
			checkTopicsWith(t, b.addr, b.adminOpts(t), lf, 0)
		})
	}
	t.Run("ProgressTopicRead", func(t *testing.T) {
		// The progress is read back at a restart: revoke Read after a
		// first run.
		b := startSASLBroker(t, kafkasec.MechanismSCRAMSHA256, ledgerGrants("")...)
		db := filepath.Join(t.TempDir(), "outboxd.db")
		p, _ := run(t, b, db)
		waitPublished(t, db, int64(len(lf.data)))
		p.stop(t, 30*time.Second)
		readTopic := func() *kadm.ACLBuilder {
			return kadm.NewACLs().Topics("__outboxd_progress").Operations(kadm.OpRead)
		}
		b.revoke(t, readTopic())
		more := makeLedger(rng, 500)
		f, err := os.OpenFile(filepath.Join(filepath.Dir(db), "ledger.csv"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(more.data)
		f.Close()
		p2 := start(t, nil, append(ledgerArgs(db, filepath.Join(filepath.Dir(db), "ledger.csv"), "--http", "127.0.0.1:0"),
			b.serverArgs(t, serverSecret)...)...)
		base := "http://" + httpAddr(t, p2)
		waitRelay(t, base, "unauthorized", `not authorized: User:outboxd lacks Read on topic "__outboxd_progress" (TOPIC_AUTHORIZATION_FAILED)`)
		refusedOnce(t, p2, b, "Kafka refused the relay")
		b.grant(t, readTopic())
		waitPublished(t, db, int64(len(lf.data)+len(more.data)))
		p2.stop(t, 30*time.Second)
		got := readAllWith(t, b.addr, b.adminOpts(t), "ledger.out", "ledger.dlq")
		if n, want := len(got["ledger.out"])+len(got["ledger.dlq"]), countLines(lf)+countLines(more); n != want {
			t.Fatalf("%d records published, want %d: one per line, once", n, want)
		}
	})
	t.Run("KafkaFeed", func(t *testing.T) {
		// No Read on the feed's topic: the feed is stalled, saying so.
		// No Read on its group: the feed reads on, its lastError says
		// the group's offsets are refused.
		grants := append(ledgerGrants(""), topicACL("in.", true, kmsg.ACLOperationWrite, kmsg.ACLOperationCreate)...)
		b := startSASLBroker(t, kafkasec.MechanismSCRAMSHA256, grants...)
		if _, err := b.admin.CreateTopics(context.Background(), 1, 1, nil, "in"); err != nil {
			t.Fatal(err)
		}
		var lines strings.Builder
		for i := range 50 {
			fmt.Fprintf(&lines, "line %d\n", i)
		}
		pw := filepath.Join(t.TempDir(), "admin-password")
		if err := os.WriteFile(pw, []byte(adminPassword), 0o600); err != nil {
			t.Fatal(err)
		}
		admin := []string{"--brokers", b.addr, "--kafka-tls-ca", b.ca.File, "--kafka-sasl-mechanism", b.mech,
			"--kafka-sasl-user", adminUser, "--kafka-sasl-password-file", pw}
		if _, errOut, code := tool(t, lines.String(), append([]string{"produce", "--topic", "in"}, admin...)...); code != 0 {
			t.Fatalf("produce: %s", errOut)
		}
		db := filepath.Join(t.TempDir(), "outboxd.db")
		p := start(t, nil, append([]string{"--db", db, "--http", "127.0.0.1:0", "--feed", "in=kafka:in"}, b.serverArgs(t, serverSecret)...)...)
		base := "http://" + httpAddr(t, p)
		waitFeed(t, base, "in", "stalled", `not authorized: User:outboxd lacks Read on topic "in" (TOPIC_AUTHORIZATION_FAILED)`)
		refusedOnce(t, p, b, "Kafka refused the feed")
		b.grant(t, kadm.NewACLs().Topics("in").Operations(kadm.OpRead))
		fs := waitFeed(t, base, "in", "caught-up", `not authorized: User:outboxd lacks Read on group "outboxd-in" (GROUP_AUTHORIZATION_FAILED)`)
		if fs.Position != 50 {
			t.Fatalf("position %d, want 50", fs.Position)
		}
		b.grant(t, kadm.NewACLs().Groups("outboxd-in").Operations(kadm.OpRead))
		wait(t, 60*time.Second, func() error {
			var fs feedState
			if err := getJSON(base+"/feeds/in/status", &fs); err != nil {
				return err
			}
			if fs.State != "caught-up" || fs.LastError != "" {
				return fmt.Errorf("feed in %s %q, want caught-up with no error", fs.State, fs.LastError)
			}
			return nil
		})
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Fatalf("exit code %d", code)
		}
		if got := readAllWith(t, b.addr, b.adminOpts(t), "in.out"); len(got["in.out"]) != 50 {
			t.Fatalf("in.out holds %d records, want 50", len(got["in.out"]))
		}
	})
}

// refusedOnce checks that the server logged the refusal once, after it
// was refused again: after the next connection (the relay checks its
// credentials at each try, every 10s), or for a feed, whose refusal comes
// on its metadata requests (every 2s, on the connection it has), after 5s.
func refusedOnce(t *testing.T, p *proc, b *secureBroker, line string) {
	t.Helper()
	n0, t0 := b.accepts.Load(), time.Now()
	wait(t, 60*time.Second, func() error {
		switch {
		case strings.Contains(line, "feed") && time.Since(t0) < 5*time.Second:
			return fmt.Errorf("%v of 5s since the refusal", time.Since(t0).Round(time.Second))
		case !strings.Contains(line, "feed") && b.accepts.Load() == n0:
			return errors.New("no connection since the refusal")
		}
		return nil
	})
	if n := logged(p, line); n != 1 {
		t.Fatalf("%d log lines %q, want 1:\n%s", n, line, tail(p.log.String(), 3000))
	}
}

// countLines is the number of lines of lf.
func countLines(lf ledgerFile) int { return len(lf.valid) + len(lf.malformed) }

// A wrong password is one clear error, not a storm of reconnects: the
// relay says unauthorized and the Kafka feed stalled, each naming the
// mechanism and the user; each says so once in the log; over 25 seconds
// each asks again every 10 seconds, one connection a time; the password
// shows nowhere. Put right, the server goes on by itself.
func TestKafkaSec_WrongPassword(t *testing.T) {
	r := kmsg.ACLOperationRead
	grants := append(ledgerGrants(""), topicACL("in", false, r)...)
	grants = append(grants, acls(kmsg.ACLResourceTypeGroup, "outboxd-in", false, r)...)
	grants = append(grants, topicACL("in.", true, kmsg.ACLOperationWrite, kmsg.ACLOperationCreate)...)
	b := startSASLBroker(t, kafkasec.MechanismSCRAMSHA512, grants...)
	if _, err := b.admin.CreateTopics(context.Background(), 1, 1, nil, "in"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	db := filepath.Join(dir, "outboxd.db")
	args := []string{"--db", db, "--http", "127.0.0.1:0", "--feed", "in=kafka:in"}
	// A first run publishes, so the database is known to Kafka and the
	// server starts without waiting for its new-database check.
	ctx := context.Background()
	for i := range 5 {
		if err := b.adminCl.ProduceSync(ctx, &kgo.Record{Topic: "in", Value: []byte(fmt.Sprint("first ", i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	p := start(t, nil, append(args, b.serverArgs(t, serverSecret)...)...)
	base := "http://" + httpAddr(t, p)
	wait(t, 60*time.Second, func() error { return publishedAtLeast(db, 5) })
	p.stop(t, 30*time.Second)

	const wrong = "Wr0ng-Passw0rd"
	p = start(t, nil, append(args, b.serverArgs(t, wrong)...)...)
	base = "http://" + httpAddr(t, p)
	who := `SASL SCRAM-SHA-512 as "outboxd"`
	waitRelay(t, base, "unauthorized", who, "wrong user or password")
	waitFeed(t, base, "in", "stalled", who, "wrong user or password")
	start0, n0 := time.Now(), b.accepts.Load()
	wait(t, 60*time.Second, func() error {
		if d := time.Since(start0); d < 25*time.Second {
			return fmt.Errorf("%v of 25s", d.Round(time.Second))
		}
		return nil
	})
	took, n := time.Since(start0), b.accepts.Load()-n0
	// Two clients (the relay, the feed), each one connection per 10s.
	if most := 2 * (int64(took/(10*time.Second)) + 1); n > most {
		t.Fatalf("%d connections in %v, want at most %d", n, took.Round(time.Second), most)
	}
	for _, line := range []string{"Kafka refused the relay", "Kafka refused the feed"} {
		if got := logged(p, line); got != 1 {
			t.Fatalf("%d log lines %q, want 1:\n%s", got, line, tail(p.log.String(), 3000))
		}
	}
	var ready struct {
		Ready bool `json:"ready"`
	}
	if err := getJSON(base+"/readyz", &ready); err == nil || ready.Ready {
		t.Fatalf("/readyz: ready %v (%v), want 503", ready.Ready, err)
	}
	if strings.Contains(p.log.String(), wrong) {
		t.Fatal("the password is in the log")
	}
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// The consume and produce commands meet a wrong password with one error
// line and exit 1, at once.
func TestKafkaSec_ToolsWrongPassword(t *testing.T) {
	b := startSASLBroker(t, kafkasec.MechanismPlain)
	for _, cmd := range [][]string{{"consume", "--topic", "x", "--until-end"}, {"produce", "--topic", "x"}} {
		started := time.Now()
		_, errOut, code := tool(t, "a\n", append(cmd, b.serverArgs(t, "nope")...)...)
		if code != 1 || !strings.Contains(errOut, `SASL PLAIN as "outboxd"`) || time.Since(started) > 10*time.Second {
			t.Fatalf("%s: exit %d after %v: %q", cmd[0], code, time.Since(started), errOut)
		}
	}
}

// publishedAtLeast says whether the database holds at least n outbox rows
// and the relay published every one.
func publishedAtLeast(db string, n int64) error {
	ctx := context.Background()
	s, err := outbox.Open(ctx, outbox.DefaultConfig(db))
	if err != nil {
		return err
	}
	defer s.Close()
	if last, err := s.LastOutboxID(ctx); err != nil || last < n {
		return fmt.Errorf("%d outbox rows (%v), want %d", last, err, n)
	}
	return relayDone(ctx, s)
}

// A start that Kafka refuses, on a new database (the relay's check that
// it replaces none must read the progress topic before the claim) as on
// a used one: the API listens at once, the relay's state is unauthorized
// with the refusal as its lastError, /readyz answers 503, one log line
// says so, and the server keeps running. A refusal an operator lifts
// (a grant) is picked up without a restart.
func TestKafkaSec_RefusedStart(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 17))
	lf := makeLedger(rng, 300)
	other, err := testcerts.NewCA(t.TempDir(), "other")
	if err != nil {
		t.Fatal(err)
	}
	readProgress := func() *kadm.ACLBuilder {
		return kadm.NewACLs().Topics("__outboxd_progress").Operations(kadm.OpRead)
	}
	cases := []struct {
		name string
		// args are the refused start's Kafka flags; before runs just before it.
		args   func(t *testing.T, b *secureBroker) []string
		before func(t *testing.T, b *secureBroker, used bool)
		want   string
		// lift lifts the refusal without a restart, when an operator can.
		lift func(t *testing.T, b *secureBroker)
	}{
		{name: "WrongPassword", args: func(t *testing.T, b *secureBroker) []string { return b.serverArgs(t, "Wr0ng") },
			want: `SASL SCRAM-SHA-256 as "outboxd"`},
		{name: "UnknownUser", args: func(t *testing.T, b *secureBroker) []string {
			return withFlag(b.serverArgs(t, serverSecret), "--kafka-sasl-user", "nobody")
		}, want: `SASL SCRAM-SHA-256 as "nobody"`},
		{name: "WrongCA", args: func(t *testing.T, b *secureBroker) []string {
			return withFlag(b.serverArgs(t, serverSecret), "--kafka-tls-ca", other.File)
		}, want: "the broker's certificate is not trusted"},
		{name: "UnsupportedMechanism", args: func(t *testing.T, b *secureBroker) []string {
			// The broker's flags but its address and CA: --kafka-sasl-user and
			// --kafka-sasl-password-file.
			return append([]string{"--brokers", saslRefusingBroker(t), "--kafka-sasl-mechanism", kafkasec.MechanismSCRAMSHA256},
				b.serverArgs(t, serverSecret)[6:]...)
		}, want: "the broker does not offer SCRAM-SHA-256 (it offers SCRAM-SHA-512)"},
		{name: "ProgressTopicRead", args: func(t *testing.T, b *secureBroker) []string { return b.serverArgs(t, serverSecret) },
			before: func(t *testing.T, b *secureBroker, used bool) {
				if !used {
					// A cluster where another database published: the new
					// database's check has progress records to read (an
					// empty topic needs no Read).
					dir := t.TempDir()
					input := filepath.Join(dir, "other.csv")
					if err := os.WriteFile(input, []byte("carol,1\n"), 0o644); err != nil {
						t.Fatal(err)
					}
					db := filepath.Join(dir, "other.db")
					p := start(t, nil, append([]string{"--db", db, "--feed", "other=file:" + input, "--processor", "other=ledger",
						"--topic", "other=ledger.other", "--http", "127.0.0.1:0"}, b.serverArgs(t, serverSecret)...)...)
					wait(t, 60*time.Second, func() error { return publishedAtLeast(db, 1) })
					if code := p.stop(t, 30*time.Second); code != exitOK {
						t.Fatalf("the other database's run: exit code %d", code)
					}
				}
				b.revoke(t, readProgress())
			},
			want: `not authorized: User:outboxd lacks Read on topic "__outboxd_progress"`,
			lift: func(t *testing.T, b *secureBroker) { b.grant(t, readProgress()) }},
	}
	for _, c := range cases {
		for _, used := range []bool{false, true} {
			name := c.name + "/New"
			if used {
				name = c.name + "/Used"
			}
			t.Run(name, func(t *testing.T) {
				b := startSASLBroker(t, kafkasec.MechanismSCRAMSHA256, ledgerGrants("")...)
				dir := t.TempDir()
				db, input := filepath.Join(dir, "outboxd.db"), filepath.Join(dir, "ledger.csv")
				if err := os.WriteFile(input, lf.data, 0o644); err != nil {
					t.Fatal(err)
				}
				args := ledgerArgs(db, input, "--http", "127.0.0.1:0")
				if used {
					p := start(t, nil, append(args, b.serverArgs(t, serverSecret)...)...)
					waitPublished(t, db, int64(len(lf.data)))
					if code := p.stop(t, 30*time.Second); code != exitOK {
						t.Fatalf("first run: exit code %d", code)
					}
				}
				if c.before != nil {
					c.before(t, b, used)
				}
				started := time.Now()
				p := start(t, nil, append(args, c.args(t, b)...)...)
				base := "http://" + httpAddr(t, p)
				if d := time.Since(started); d > 20*time.Second {
					t.Fatalf("the API listened %v after the start", d)
				}
				waitRelay(t, base, "unauthorized", c.want)
				code, rd, err := getReadiness(base)
				if err != nil || code != 503 || !hasPrefix(rd.Reasons, "relay: unauthorized: ") {
					t.Fatalf("readyz %d %q (%v), want 503 saying the relay is unauthorized", code, rd.Reasons, err)
				}
				if n := logged(p, "Kafka refused the relay"); n != 1 {
					t.Fatalf("%d log lines saying Kafka refused the relay, want 1:\n%s", n, tail(p.log.String(), 3000))
				}
				alive(t, p, base)
				if c.lift != nil {
					c.lift(t, b)
					waitPublished(t, db, int64(len(lf.data)))
					checkTopicsWith(t, b.addr, b.adminOpts(t), lf, 0)
				}
				p.cmd.Process.Signal(syscall.SIGTERM) // running, or still starting
				if code := waitExit(t, p, 30*time.Second); code != exitOK {
					t.Fatalf("exit code %d after SIGTERM, want 0", code)
				}
			})
		}
	}
}

// withFlag returns args with flag's value replaced by v.
func withFlag(args []string, flag, v string) []string {
	out := slices.Clone(args)
	for i := range out[:len(out)-1] {
		if out[i] == flag {
			out[i+1] = v
			return out
		}
	}
	return append(out, flag, v)
}

// saslRefusingBroker listens on loopback and answers as a broker whose
// listener offers only SCRAM-SHA-512: ApiVersions, then
// UNSUPPORTED_SASL_MECHANISM to every other handshake. It returns its
// address.
func saslRefusingBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go answerSASLRefusal(conn)
		}
	}()
	return ln.Addr().String()
}

// answerSASLRefusal serves one connection of saslRefusingBroker.
func answerSASLRefusal(conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	for {
		var size [4]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return
		}
		req := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(conn, req); err != nil || len(req) < 8 {
			return
		}
		key, version := int16(binary.BigEndian.Uint16(req)), int16(binary.BigEndian.Uint16(req[2:]))
		var resp kmsg.Response
		switch key {
		case kmsg.ApiVersions.Int16():
			r := kmsg.NewPtrApiVersionsResponse()
			for _, k := range []kmsg.Key{kmsg.ApiVersions, kmsg.SASLHandshake, kmsg.SASLAuthenticate, kmsg.Metadata} {
				r.ApiKeys = append(r.ApiKeys, kmsg.ApiVersionsResponseApiKey{ApiKey: k.Int16(), MaxVersion: 1})
			}
			resp = r
		case kmsg.SASLHandshake.Int16():
			r := kmsg.NewPtrSASLHandshakeResponse()
			r.ErrorCode, r.SupportedMechanisms = 33, []string{kafkasec.MechanismSCRAMSHA512} // UNSUPPORTED_SASL_MECHANISM
			resp = r
		default:
			return
		}
		resp.SetVersion(version)
		body := resp.AppendTo(binary.BigEndian.AppendUint32(nil, binary.BigEndian.Uint32(req[4:]))) // the correlation id
		if _, err := conn.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)); err != nil {
			return
		}
	}
}

// Against a TLS listener, a server without --kafka-tls is not told that
// the broker is down: its relay's lastError, and the log, ask whether TLS
// is missing, on a new database (its check of the progress topic) as on a
// used one, without SASL (franz-go's own hint) and with it (the
// credentials' check).
func TestKafkaSec_TLSMissing(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 19))
	lf := makeLedger(rng, 200)
	for _, c := range []struct {
		name string
		sasl bool
		used bool
	}{{"New", false, false}, {"Used", false, true}, {"NewSASL", true, false}, {"UsedSASL", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			b := startSASLBroker(t, kafkasec.MechanismSCRAMSHA256, ledgerGrants("")...)
			dir := t.TempDir()
			db, input := filepath.Join(dir, "outboxd.db"), filepath.Join(dir, "ledger.csv")
			if err := os.WriteFile(input, lf.data, 0o644); err != nil {
				t.Fatal(err)
			}
			args := ledgerArgs(db, input, "--http", "127.0.0.1:0")
			if c.used {
				p := start(t, nil, append(args, b.serverArgs(t, serverSecret)...)...)
				waitPublished(t, db, int64(len(lf.data)))
				if code := p.stop(t, 30*time.Second); code != exitOK {
					t.Fatalf("first run: exit code %d", code)
				}
			}
			plain := []string{"--brokers", b.addr}
			if c.sasl {
				plain = append(plain, b.serverArgs(t, serverSecret)[4:]...) // all but --kafka-tls-ca
			}
			p := start(t, nil, append(args, plain...)...)
			base := "http://" + httpAddr(t, p)
			const hint = "is TLS missing"
			var os outboxState
			wait(t, 60*time.Second, func() error {
				if err := getJSON(base+"/outbox/status", &os); err != nil {
					return err
				}
				if !strings.Contains(os.Relay.LastError, hint) {
					return fmt.Errorf("relay %s, lastError %q: no TLS hint", os.Relay.State, os.Relay.LastError)
				}
				return nil
			})
			if logged(p, hint) == 0 {
				t.Fatalf("the log has no TLS hint:\n%s", tail(p.log.String(), 3000))
			}
			p.cmd.Process.Signal(syscall.SIGTERM)
			if code := waitExit(t, p, 30*time.Second); code != exitOK {
				t.Fatalf("exit code %d after SIGTERM, want 0", code)
			}
		})
	}
}
