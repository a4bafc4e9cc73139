package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/sink"
)

// testTargets are the in-process targets of scheme testsink, by host.
var testTargets sync.Map // host -> sink.Target (a *heldRows unless a test stored another)

// heldRows is an in-process exactly-once target: it holds what it is
// given and tells the last id it holds.
type heldRows struct {
	mu   sync.Mutex
	rows []outbox.Row
}

func (h *heldRows) Resume(context.Context) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.rows) == 0 {
		return 0, nil
	}
	return h.rows[len(h.rows)-1].ID, nil
}

func (h *heldRows) Deliver(_ context.Context, rows []outbox.Row) ([]outbox.RowDeadLetter, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range rows {
		r.Value = bytes.Clone(r.Value)
		h.rows = append(h.rows, r)
	}
	return nil, nil
}

func (h *heldRows) Close() error { return nil }

func (h *heldRows) values() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, len(h.rows))
	for i, r := range h.rows {
		out[i] = r.Topic + ":" + string(r.Value)
	}
	return out
}

func init() {
	sink.Register("testsink", sink.Kind{
		Check: func(s sink.Spec) error {
			for k := range s.Options {
				if k != "flavour" {
					return fmt.Errorf("unknown option %q", k)
				}
			}
			return nil
		},
		Open: func(_ context.Context, s sink.Spec) (sink.Target, error) {
			h, _ := testTargets.LoadOrStore(s.URL.Host, &heldRows{})
			return h.(sink.Target), nil
		},
	})
}

func TestParseConfig_Sinks(t *testing.T) {
	t.Run("Flag", func(t *testing.T) {
		c, err := ParseConfig([]string{"--sink", "a=testsink://h1", "--sink", "b=testsink://h2/x"}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Sinks) != 2 || c.Sinks[0].Name != "a" || c.Sinks[0].URL != "testsink://h1" ||
			c.Sinks[1].Name != "b" || c.Sinks[1].URL != "testsink://h2/x" || c.Sinks[0].Topics != nil {
			t.Fatalf("sinks %+v", c.Sinks)
		}
		if o := c.Origin("sinks[].url"); o != "--sink" {
			t.Fatalf("origin %q", o)
		}
	})
	t.Run("Env", func(t *testing.T) {
		c, err := ParseConfig(nil, env(map[string]string{"OUTBOXD_SINK": "a=testsink://h1,b=testsink://h2"}))
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Sinks) != 2 || c.Sinks[1].URL != "testsink://h2" {
			t.Fatalf("sinks %+v", c.Sinks)
		}
	})
	t.Run("File", func(t *testing.T) {
		path := writeYAML(t, `sinks:
  - name: events
    url: testsink://h1
    batch: 50
    options: {flavour: sour}
    topics:
      ledger.out: {stream: LEDGER, subject: ledger.balances}
      orders.status:
  - name: other
    url: testsink://h2
`)
		c, err := ParseConfig([]string{"--config", path, "--sink", "other=testsink://h3"}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		s := c.Sinks[0]
		if len(c.Sinks) != 2 || s.Name != "events" || s.Batch != 50 || s.Options["flavour"] != "sour" ||
			*s.Topics["ledger.out"] != (SinkTopicConfig{Stream: "LEDGER", Subject: "ledger.balances"}) {
			t.Fatalf("sinks %+v", c.Sinks)
		}
		if _, ok := s.Topics["orders.status"]; !ok {
			t.Fatalf("topic orders.status missing: %+v", s.Topics)
		}
		if c.Sinks[1].URL != "testsink://h3" {
			t.Fatalf("the flag did not set the file's sink other: %+v", c.Sinks[1])
		}
		spec, err := s.spec("")
		if err != nil {
			t.Fatal(err)
		}
		if !spec.Takes("orders.status") || spec.Takes("x.out") || spec.Topic("ledger.out").Subject != "ledger.balances" {
			t.Fatalf("spec %+v", spec)
		}
	})
	for _, tc := range []struct {
		name string
		args []string
		yaml string
		want string // the error, after "--config PATH: " for a file
	}{
		{"NoEquals", []string{"--sink", "a"}, "", `invalid value "a" for flag -sink: "a": want NAME=URL, such as events=nats://127.0.0.1:4222`},
		{"BadName", []string{"--sink", "a b=testsink://h"}, "", `invalid value "a b=testsink://h" for flag -sink: "a b=testsink://h": a sink's name is letters, digits, '.', '_' and '-'`},
		{"NoScheme", []string{"--sink", "a=127.0.0.1:4222"}, "", `invalid value "a=127.0.0.1:4222" for flag -sink: "127.0.0.1:4222": want SCHEME://HOST..., such as nats://127.0.0.1:4222`},
		{"UnknownScheme", []string{"--sink", "a=nosuch://u:secret@h"}, "", `--sink a=nosuch://u:xxxxx@h: sink a: "nosuch://": no sink target for this URL scheme (registered: `},
		{"FileUnknownOption", nil, "sinks:\n  - name: a\n    url: testsink://h\n    options: {colour: red}\n", `line 3: sinks[0].url: sink a: unknown option "colour"`},
		{"FileTwice", nil, "sinks:\n  - name: a\n    url: testsink://h\n  - name: a\n    url: testsink://h\n", `line 4: sinks[1].name: sink a: given twice`},
		{"FileNoURL", nil, "sinks:\n  - name: a\n", `line 2: sinks[0]: sink a: no url`},
		{"FileUnknownKey", nil, "sinks:\n  - name: a\n    url: testsink://h\n    batchh: 5\n", `line 4: unknown key sinks[0].batchh (the closest known key is sinks[0].batch)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, want := tc.args, tc.want
			if tc.yaml != "" {
				path := writeYAML(t, tc.yaml)
				args, want = []string{"--config", path}, "--config "+path+": "+tc.want
			}
			_, err := ParseConfig(args, env(nil))
			if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %v\nwant  %s...", err, want)
			}
			var out, errOut bytes.Buffer
			if code := Command(args, &out, &errOut); code != ExitConfig || strings.Count(errOut.String(), "\n") != 1 {
				t.Fatalf("exit code %d, stderr %q: want %d and one line", code, errOut.String(), ExitConfig)
			}
		})
	}
}

// TestMain_Sink: the service relays a feed's outputs to a sink, each
// once, in id order, and stores the sink's progress; a sink mapped to
// another topic takes none of them but passes over every row.
func TestMain_Sink(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in", "l.csv")
	if err := os.MkdirAll(filepath.Dir(in), 0o755); err != nil {
		t.Fatal(err)
	}
	var lines strings.Builder
	for i := range 500 {
		fmt.Fprintf(&lines, "line-%d\n", i)
	}
	if err := os.WriteFile(in, []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := writeYAML(t, "sinks:\n  - name: none\n    url: testsink://main-none\n    topics:\n      nothing.out:\n")
	r := runMain(t, "--config", cfg, "--db", filepath.Join(dir, "db", "o.db"), "--http", "127.0.0.1:0", "--relay", "none",
		"--feed", "l=file:"+in, "--sink", "all=testsink://main-all")
	r.ready(t)
	h, _ := testTargets.Load("main-all")
	wait(t, 30*time.Second, func() error {
		st := r.m.SinkStatuses()
		if len(st) != 2 || st[0].Stored != 500 || st[1].Stored != 500 {
			return fmt.Errorf("statuses %+v", st)
		}
		return nil
	})
	got := h.(*heldRows).values()
	if len(got) != 500 {
		t.Fatalf("%d rows, want 500", len(got))
	}
	for i, v := range got {
		if want := fmt.Sprintf("l.out:line-%d", i); v != want {
			t.Fatalf("row %d = %q, want %q", i, v, want)
		}
	}
	none, _ := testTargets.Load("main-none")
	if n := len(none.(*heldRows).values()); n != 0 {
		t.Fatalf("sink none took %d rows", n)
	}
	// The API shows both.
	for path, want := range map[string][]string{
		"/sinks": {`"name":"all","kind":"testsink","url":"testsink://main-all","state":"idle","topics":[],"deliveredId":500,"storedId":500,"lagRows":0`,
			`"name":"none","kind":"testsink","url":"testsink://main-none","state":"idle","topics":["nothing.out"],"deliveredId":500,"storedId":500`,
			`"deliveredTotal":500`},
		"/outbox/status": {`"sinks":[{"name":"all","state":"idle","lagRows":0,"lagBytes":0,"lastError":""},{"name":"none"`},
		"/metrics":       {"outboxd_sink_delivered_total{sink=\"all\"} 500\n", "outboxd_sink_delivered_total{sink=\"none\"} 0\n"},
	} {
		res, err := http.Get(r.m.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				t.Errorf("GET %s lacks %s:\n%s", path, w, b)
			}
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// gate is a testsink target that delivers only while open.
type gate struct {
	heldRows
	open chan struct{}
}

func (g *gate) Deliver(ctx context.Context, rows []outbox.Row) ([]outbox.RowDeadLetter, error) {
	select {
	case <-g.open:
		return g.heldRows.Deliver(ctx, rows)
	default:
		return nil, fmt.Errorf("target down")
	}
}

// TestMain_SinkHoldsPruningAndBacklog: with the relay off, a sink that is
// down holds pruning (nothing of the outbox goes) and the backlog bound
// (the feed pauses in backpressure); once it delivers, the feed goes on
// to the end and every row is pruned.
func TestMain_SinkHoldsPruningAndBacklog(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	testTargets.Store("gated", g)
	dir := t.TempDir()
	in := filepath.Join(dir, "in", "l.csv")
	if err := os.MkdirAll(filepath.Dir(in), 0o755); err != nil {
		t.Fatal(err)
	}
	var lines strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&lines, "line-%d\n", i)
	}
	if err := os.WriteFile(in, []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runMain(t, "--db", filepath.Join(dir, "db", "o.db"), "--http", "127.0.0.1:0", "--relay", "none",
		"--feed", "l=file:"+in, "--sink", "g=testsink://gated", "--max-backlog-rows", "200", "--batch-max", "50",
		"--outbox-retention", "0s")
	r.ready(t)
	ctx := context.Background()
	wait(t, 30*time.Second, func() error {
		if st, _ := r.m.Loops[0].State(); st != outbox.StateBackpressure {
			return fmt.Errorf("feed state %s", st)
		}
		return nil
	})
	last, err := r.m.Store.LastOutboxID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if last < 200 || last >= 1000 {
		t.Fatalf("last id %d while the sink is down: want the bound's 200 and some, not all 1000", last)
	}
	rows, err := r.m.Store.Rows(ctx, 0, 2000)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(rows)) != last || len(rows) == 0 || rows[0].ID != 1 {
		t.Fatalf("%d rows kept, want all %d: pruned while the sink had none", len(rows), last)
	}
	if st := r.m.SinkStatuses()[0]; st.State != sink.StateBackingOff || !strings.Contains(st.LastError, "target down") {
		t.Fatalf("sink status %+v", st)
	}
	close(g.open)
	wait(t, 30*time.Second, func() error {
		if st := r.m.SinkStatuses()[0]; st.Stored != 1000 {
			return fmt.Errorf("sink status %+v", st)
		}
		rows, err := r.m.Store.Rows(ctx, 0, 2000)
		if err != nil || len(rows) != 0 {
			return fmt.Errorf("%d rows kept, want none (err %v)", len(rows), err)
		}
		return nil
	})
	got := g.values()
	if len(got) != 1000 || got[0] != "l.out:line-0" || got[999] != "l.out:line-999" {
		t.Fatalf("%d rows delivered, want 1000 in order", len(got))
	}
}
