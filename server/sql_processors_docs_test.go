package server

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// docsBlocks are the fenced blocks of lang ("yaml", "" for none) in the
// section of docs/processors.md under heading, in order.
func docsBlocks(t *testing.T, heading, lang string) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/processors.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/processors.md has no section %q", heading)
	}
	if i := strings.Index(sec, "\n#"); i >= 0 {
		sec = sec[:i]
	}
	var out []string
	var block []string
	in, want := false, false
	for _, line := range strings.Split(sec, "\n") {
		switch {
		case !in && strings.HasPrefix(line, "```"):
			in, want, block = true, line == "```"+lang, nil
		case in && line == "```":
			in = false
			if want {
				out = append(out, strings.Join(block, "\n"))
			}
		case in:
			block = append(block, line)
		}
	}
	if in {
		t.Fatalf("section %q: a block does not end", heading)
	}
	return out
}

// docsRun is a docs example's configuration, started on one store as the
// server starts it: each feed's processor made and set up.
type docsRun struct {
	t     *testing.T
	store *outbox.Store
	procs map[string]ingest.Processor // by feed
	pos   map[string]int64
}

func startDocs(t *testing.T, yaml string, s *outbox.Store) (*docsRun, error) {
	t.Helper()
	c, err := ParseConfig([]string{"--config", writeYAML(t, yaml+"\n")}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		s = outboxtest.NewStore(t, nil)
		if err := sqlproc.Guard(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	r := &docsRun{t: t, store: s, procs: map[string]ingest.Processor{}, pos: map[string]int64{}}
	for _, feed := range c.FeedNames() {
		p, err := newSQLProcessor(feed, c.Feeds[feed], c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RegisterFeed(context.Background(), outbox.FeedInfo{Name: feed, Kind: "file", Source: "f", Processor: c.Feeds[feed].Processor}); err != nil {
			t.Fatal(err)
		}
		if err := r.inTx(func(tx *outbox.Tx) error { return p.(ingest.Setupper).Setup(context.Background(), tx) }); err != nil {
			return nil, err
		}
		r.procs[feed] = p
	}
	return r, nil
}

func (r *docsRun) inTx(f func(tx *outbox.Tx) error) error {
	tx, err := r.store.Begin(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// apply applies line to feed's processor as the loop does, returning the
// item's error (a dead letter's).
func (r *docsRun) apply(feed, line string) error {
	r.t.Helper()
	r.pos[feed] += int64(len(line) + 1)
	d := ingest.Delivery{Feed: feed, Epoch: "e", Position: r.pos[feed], Sequence: r.pos[feed], Attempt: 1}
	var applyErr error
	if err := r.inTx(func(tx *outbox.Tx) error {
		if err := tx.BeginItem(d.Place()); err != nil {
			return err
		}
		if applyErr = r.procs[feed].Apply(context.Background(), tx, d, ingest.Item{Value: []byte(line)}); applyErr != nil {
			return tx.RollbackItem()
		}
		return tx.EndItem()
	}); err != nil {
		r.t.Fatal(err)
	}
	return applyErr
}

// outputs are the stored outputs as "topic key value".
func (r *docsRun) outputs() []string {
	r.t.Helper()
	rs, err := r.store.Rows(context.Background(), 0, 1000)
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, row := range rs {
		out = append(out, fmt.Sprintf("%s %s %s", row.Topic, row.Key, row.Value))
	}
	return out
}

func TestDocs_Migrations(t *testing.T) {
	blocks := docsBlocks(t, "### Migrations", "yaml")
	if len(blocks) != 1 {
		t.Fatalf("%d yaml blocks, want 1", len(blocks))
	}
	r, err := startDocs(t, blocks[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"a,5", "a,-2"} {
		if err := r.apply("payments", l); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{`balances a {"balance":5,"updates":1}`, `balances a {"balance":3,"updates":2}`}
	if got := r.outputs(); !reflect.DeepEqual(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
	if _, err := startDocs(t, blocks[0], r.store); err != nil { // a restart runs nothing again
		t.Fatal(err)
	}
	var cols []string
	if err := outboxtest.Select(context.Background(), r.store, &cols, "SELECT name FROM pragma_table_info('balances') ORDER BY cid"); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cols, []string{"account", "balance", "updates"}) {
		t.Fatalf("columns %v", cols)
	}
	changed := strings.Replace(blocks[0], "DEFAULT 0;", "DEFAULT 1;", 1)
	_, err = startDocs(t, changed, r.store)
	msgs := docsBlocks(t, "### Migrations", "")
	if err == nil || len(msgs) != 1 || err.Error() != msgs[0] {
		t.Fatalf("a changed migration: %v\nthe docs say %q", err, msgs)
	}
}

func TestDocs_Windows(t *testing.T) {
	blocks := docsBlocks(t, "### Windows and watermarks", "yaml")
	if len(blocks) != 1 {
		t.Fatalf("%d yaml blocks, want 1", len(blocks))
	}
	r, err := startDocs(t, blocks[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	for _, at := range []string{"10:00:05", "10:00:50", "10:01:02", "10:00:55", "10:01:15", "10:00:59"} {
		if err := r.apply("clicks", `{"page":"/","at":"2026-12-01T`+at+`Z"}`); err != nil {
			errs = append(errs, at+" "+err.Error())
		}
	}
	if want := []string{`clicks.per-minute / {"window":"10:00","clicks":3}`}; !reflect.DeepEqual(r.outputs(), want) {
		t.Fatalf("outputs %q, want %q", r.outputs(), want)
	}
	want := []string{"10:00:59 late: event time 2026-12-01T10:00:59Z is behind the watermark 2026-12-01T10:01:05Z (the largest event time seen, 2026-12-01T10:01:15Z, less the lateness 10s): its windows have closed"}
	if !reflect.DeepEqual(errs, want) {
		t.Fatalf("errors %q, want %q", errs, want)
	}
}

func TestDocs_Joins(t *testing.T) {
	blocks := docsBlocks(t, "### Joins across feeds", "yaml")
	if len(blocks) != 1 {
		t.Fatalf("%d yaml blocks, want 1", len(blocks))
	}
	r, err := startDocs(t, blocks[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range [][2]string{{"prices", "apple,3"}, {"orders", "o1,apple,2"}, {"prices", "apple,4"}, {"orders", "o2,apple,10"}, {"orders", "o3,pear,1"}} {
		if err := r.apply(l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		`orders.priced o1 {"product":"apple","total":6}`,
		`orders.priced o2 {"product":"apple","total":40}`,
		`orders.priced o3 {"product":"pear","total":null}`,
	}
	if got := r.outputs(); !reflect.DeepEqual(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}
