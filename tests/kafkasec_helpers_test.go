package tests

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/devkafka"
	"github.com/outboxd/outboxd/internal/kafkasec"
	"github.com/outboxd/outboxd/internal/testutil/securekafka"
	"github.com/outboxd/outboxd/internal/testutil/testcerts"
)

// The users of a secured broker: a superuser for the test's own reads and
// grants, and outboxd's, subject to ACLs.
const (
	adminUser     = "admin"
	adminPassword = "admin-secret"
	serverUser    = "outboxd"
	serverSecret  = "s3rver-Secret"
)

// secureBroker is a Kafka broker (kfake: the real protocol) in the test
// process, with TLS from a CA the test made, and SASL and ACLs or client
// certificates.
type secureBroker struct {
	addr    string
	dir     string
	ca      *testcerts.CA
	mech    string // SASL mechanism; "" for mutual TLS
	accepts *atomic.Int64
	admin   *kadm.Client
	adminCl *kgo.Client
	client  *testcerts.Pair // the server's certificate, under mutual TLS
}

// startSASLBroker starts a TLS broker with SASL mech and ACLs: outboxd's
// user has grants, the admin every right.
func startSASLBroker(t *testing.T, mech string, grants ...kfake.ACL) *secureBroker {
	t.Helper()
	b := newSecureBroker(t)
	b.mech = mech
	srv, err := b.ca.Server("broker")
	if err != nil {
		t.Fatal(err)
	}
	b.start(t, kfake.TLS(testcerts.ServerTLS(srv, nil)), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(mech, adminUser, adminPassword), kfake.User(mech, serverUser, serverSecret, grants...))
	return b
}

// startMutualTLSBroker starts a broker that takes only clients with a
// certificate its CA signed; it makes the server's.
func startMutualTLSBroker(t *testing.T) *secureBroker {
	t.Helper()
	b := newSecureBroker(t)
	srv, err := b.ca.Server("broker")
	if err != nil {
		t.Fatal(err)
	}
	if b.client, err = b.ca.Client("outboxd"); err != nil {
		t.Fatal(err)
	}
	b.start(t, kfake.TLS(testcerts.ServerTLS(srv, b.ca)))
	return b
}

func newSecureBroker(t *testing.T) *secureBroker {
	t.Helper()
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "kafka")
	if err != nil {
		t.Fatal(err)
	}
	return &secureBroker{dir: dir, ca: ca, accepts: new(atomic.Int64)}
}

func (b *secureBroker) start(t *testing.T, opts ...kfake.Opt) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	br, err := devkafka.StartOnWith(countingListener{Listener: ln, N: b.accepts}, devkafka.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Extra: opts,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { br.Close() })
	b.addr = br.Addr()
	b.adminCl, err = kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.addr)}, b.adminOpts(t)...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.adminCl.Close)
	b.admin = kadm.NewClient(b.adminCl)
}

// countingListener counts the connections it accepts.
type countingListener = securekafka.CountingListener

// adminOpts are the franz-go options of the test's own clients: the
// superuser, or the server's certificate under mutual TLS.
func (b *secureBroker) adminOpts(t *testing.T) []kgo.Opt {
	t.Helper()
	cfg := kafkasec.Config{TLS: kafkasec.TLSConfig{CAFile: b.ca.File}}
	password := ""
	if b.mech != "" {
		cfg.SASL = kafkasec.SASLConfig{Mechanism: b.mech, User: adminUser}
		password = adminPassword
	} else {
		cfg.TLS.CertFile, cfg.TLS.KeyFile = b.client.CertFile, b.client.KeyFile
	}
	s, err := cfg.Resolve(func(k string) string {
		if k == kafkasec.EnvPassword {
			return password
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	return securekafka.Kgo(s)
}

// serverArgs are the server's (and the tools') flags to connect as
// outboxd's user with password (written to a file: never a flag).
func (b *secureBroker) serverArgs(t *testing.T, password string) []string {
	t.Helper()
	args := []string{"--brokers", b.addr, "--kafka-tls-ca", b.ca.File}
	if b.mech == "" {
		return append(args, "--kafka-tls-cert", b.client.CertFile, "--kafka-tls-key", b.client.KeyFile)
	}
	pw := filepath.Join(b.dir, fmt.Sprintf("password-%d", time.Now().UnixNano()))
	if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return append(args, "--kafka-sasl-mechanism", b.mech, "--kafka-sasl-user", serverUser, "--kafka-sasl-password-file", pw)
}

// grant gives outboxd's user op on a resource, as an operator would.
func (b *secureBroker) grant(t *testing.T, acl *kadm.ACLBuilder) {
	t.Helper()
	res, err := b.admin.CreateACLs(context.Background(), acl.Allow("User:"+serverUser))
	for _, r := range res {
		if err == nil {
			err = r.Err
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// revoke takes away what acl names from outboxd's user.
func (b *secureBroker) revoke(t *testing.T, acl *kadm.ACLBuilder) {
	t.Helper()
	res, err := b.admin.DeleteACLs(context.Background(), acl.Allow("User:"+serverUser).AllowHosts())
	for _, r := range res {
		if err == nil {
			err = r.Err
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Grants, as the ACL table of docs/kafka.md lists them.
func topicACL(name string, prefixed bool, ops ...kmsg.ACLOperation) []kfake.ACL {
	return acls(kmsg.ACLResourceTypeTopic, name, prefixed, ops...)
}

func acls(rt kmsg.ACLResourceType, name string, prefixed bool, ops ...kmsg.ACLOperation) []kfake.ACL {
	pattern := kmsg.ACLResourcePatternTypeLiteral
	if prefixed {
		pattern = kmsg.ACLResourcePatternTypePrefixed
	}
	var out []kfake.ACL
	for _, op := range ops {
		out = append(out, kfake.ACL{Resource: rt, Name: name, Pattern: pattern, Operation: op, Allow: true})
	}
	return out
}

// ledgerGrants are the ACLs a server with a file feed "ledger" (outputs on
// ledger.out, dead letters on ledger.dlq, topics created by the relay) and
// the exactly-once relay needs: the ACL table of docs/kafka.md.
func ledgerGrants(skip string) []kfake.ACL {
	w, r, c := kmsg.ACLOperationWrite, kmsg.ACLOperationRead, kmsg.ACLOperationCreate
	parts := map[string][]kfake.ACL{
		"outputs":  topicACL("ledger.", true, w, c),
		"progress": topicACL("__outboxd_progress", false, w, r, c),
		"txn":      acls(kmsg.ACLResourceTypeTransactionalId, "outboxd-", true, w),
	}
	var out []kfake.ACL
	for k, a := range parts {
		if k != skip {
			out = append(out, a...)
		}
	}
	return out
}

// httpsClient trusts ca.
func httpsClient(ca *testcerts.CA) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
}

// getWith decodes the JSON answer of GET url, by cl, into v.
func getWith(cl *http.Client, url string, v any) error {
	resp, err := cl.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// outboxState is what a test reads of GET /outbox/status.
type outboxState struct {
	Pending         int64 `json:"pending"`
	PendingBytes    int64 `json:"pendingBytes"`
	MaxBacklogBytes int64 `json:"maxBacklogBytes"`
	MaxBacklogRows  int64 `json:"maxBacklogRows"`
	Relay           struct {
		State     string `json:"state"`
		LastError string `json:"lastError"`
	} `json:"relay"`
}

// feedState is what a test reads of GET /feeds/NAME/status.
type feedState struct {
	State     string `json:"state"`
	LastError string `json:"lastError"`
	Position  int64  `json:"position"`
}

// waitRelay waits until the relay's state is state and its error holds
// each of want.
func waitRelay(t *testing.T, base string, state string, want ...string) outboxState {
	t.Helper()
	var os outboxState
	wait(t, 60*time.Second, func() error {
		if err := getJSON(base+"/outbox/status", &os); err != nil {
			return err
		}
		if os.Relay.State != state {
			return fmt.Errorf("relay state %s (%q), want %s", os.Relay.State, os.Relay.LastError, state)
		}
		for _, w := range want {
			if !strings.Contains(os.Relay.LastError, w) {
				return fmt.Errorf("relay error %q does not say %q", os.Relay.LastError, w)
			}
		}
		return nil
	})
	return os
}

// waitFeed waits until feed's state is state and its last error holds
// each of want.
func waitFeed(t *testing.T, base, feed, state string, want ...string) feedState {
	t.Helper()
	var fs feedState
	wait(t, 60*time.Second, func() error {
		if err := getJSON(base+"/feeds/"+feed+"/status", &fs); err != nil {
			return err
		}
		if fs.State != state {
			return fmt.Errorf("feed %s state %s (%q), want %s", feed, fs.State, fs.LastError, state)
		}
		for _, w := range want {
			if !strings.Contains(fs.LastError, w) {
				return fmt.Errorf("feed %s error %q does not say %q", feed, fs.LastError, w)
			}
		}
		return nil
	})
	return fs
}

// logged counts the lines of the server's log holding s.
func logged(p *proc, s string) int {
	n := 0
	for _, line := range strings.Split(p.log.String(), "\n") {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}
