package sqlproc_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// clicksConfig counts clicks per page in windows of a minute.
func clicksConfig(change ...func(w *sqlproc.Window)) sqlproc.Config {
	w := sqlproc.Window{Time: "unixepoch(:at)", Size: time.Minute, Lateness: 10 * time.Second, Table: "click_windows"}
	for _, f := range change {
		f(&w)
	}
	return sqlproc.Config{
		Name:   "clicks",
		Input:  sqlproc.InputJSON,
		Fields: map[string]string{"page": "$.page", "at": "$.at"},
		Topic:  "clicks.per-minute",
		Window: w,
		Setup: `CREATE TABLE IF NOT EXISTS click_windows (
  page TEXT NOT NULL, window_start INTEGER NOT NULL, clicks INTEGER NOT NULL,
  PRIMARY KEY (page, window_start)) STRICT;`,
		Reject: "SELECT 'malformed', 'no page' WHERE typeof(:page) <> 'text'",
		Apply: `INSERT INTO click_windows VALUES (:page, :window_start, 1)
  ON CONFLICT (page, window_start) DO UPDATE SET clicks = clicks + 1`,
		Emit: `SELECT page AS key,
  json_object('page', page, 'window', strftime('%H:%M:%S', :window_start, 'unixepoch'),
              'end', strftime('%H:%M:%S', :window_end, 'unixepoch'), 'clicks', clicks) AS value
FROM click_windows WHERE window_start = :window_start ORDER BY page`,
	}
}

func click(page, hms string) ingest.Item {
	return line(fmt.Sprintf(`{"page":%q,"at":"2026-12-01T%sZ"}`, page, hms))
}

// keyValues are the stored outputs as "key value".
func keyValues(t *testing.T, s *outbox.Store) []string {
	t.Helper()
	var got []string
	for _, r := range rows(t, s) {
		got = append(got, fmt.Sprintf("%s %s", r.Key, r.Value))
	}
	return got
}

// windowRows are the click_windows rows as "page start clicks".
func windowRows(t *testing.T, s *outbox.Store) []string {
	t.Helper()
	var got []string
	if err := outboxtest.Select(context.Background(), s, &got,
		`SELECT page || ' ' || strftime('%H:%M:%S', window_start, 'unixepoch') || ' ' || clicks FROM click_windows ORDER BY window_start, page`); err != nil {
		t.Fatal(err)
	}
	return got
}

func watermarkRow(t *testing.T, s *outbox.Store) (maxTime string, late int64) {
	t.Helper()
	var r struct {
		Max  string `db:"m"`
		Late int64  `db:"late"`
	}
	if err := outboxtest.Get(context.Background(), s, &r,
		`SELECT strftime('%H:%M:%S', max_event_time, 'unixepoch') AS m, late FROM processor_watermarks WHERE processor = 'clicks'`); err != nil {
		t.Fatal(err)
	}
	return r.Max, r.Late
}

func TestWindow_Tumbling(t *testing.T) {
	s := openStore(t, nil)
	p := newProc(t, clicksConfig())
	setup(t, s, p)
	var errs []string
	for i, c := range []struct{ page, at string }{
		{"/", "10:00:05"},
		{"/a", "10:00:50"},
		{"/", "10:01:02"},  // watermark 10:00:52: the window 10:00 stays open
		{"/", "10:00:55"},  // behind the largest time, within the lateness: counts
		{"/a", "10:01:15"}, // watermark 10:01:05: the window 10:00 closes
		{"/", "10:00:59"},  // its window closed: late
		{"/", "10:03:30"},  // watermark 10:03:20: the window 10:01 closes; 10:02 had no item
	} {
		if err := applyItem(t, s, p, at(int64(i+1)), click(c.page, c.at)); err != nil {
			errs = append(errs, fmt.Sprintf("%d %v", i+1, err))
		}
	}
	want := []string{
		`/ {"page":"/","window":"10:00:00","end":"10:01:00","clicks":2}`,
		`/a {"page":"/a","window":"10:00:00","end":"10:01:00","clicks":1}`,
		`/ {"page":"/","window":"10:01:00","end":"10:02:00","clicks":1}`,
		`/a {"page":"/a","window":"10:01:00","end":"10:02:00","clicks":1}`,
	}
	if got := keyValues(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("outputs:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	wantErrs := []string{"6 late: event time 2026-12-01T10:00:59Z is behind the watermark 2026-12-01T10:01:05Z (the largest event time seen, 2026-12-01T10:01:15Z, less the lateness 10s): its windows have closed"}
	if !reflect.DeepEqual(errs, wantErrs) {
		t.Fatalf("errors:\n%q\nwant\n%q", errs, wantErrs)
	}
	if got := windowRows(t, s); !reflect.DeepEqual(got, []string{"/ 10:03:00 1"}) {
		t.Fatalf("windows left = %q, want only the open one", got)
	}
	if m, late := watermarkRow(t, s); m != "10:03:30" || late != 0 {
		t.Fatalf("watermark row = %s, %d late", m, late)
	}

	// A restart closes nothing again; the next item closes 10:03 once.
	p2 := newProc(t, clicksConfig())
	s2 := newStoreSame(t, s)
	setup(t, s2, p2)
	if err := applyItem(t, s2, p2, at(8), click("/", "10:05:00")); err != nil {
		t.Fatal(err)
	}
	want = append(want, `/ {"page":"/","window":"10:03:00","end":"10:04:00","clicks":1}`)
	if got := keyValues(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("outputs after a restart:\n%s", strings.Join(got, "\n"))
	}
}

func TestWindow_LateItem(t *testing.T) {
	s := openStore(t, nil)
	p := newProc(t, clicksConfig())
	setup(t, s, p)
	for i, hms := range []string{"10:00:05", "10:02:00"} {
		if err := applyItem(t, s, p, at(int64(i+1)), click("/", hms)); err != nil {
			t.Fatal(err)
		}
	}
	err := applyItem(t, s, p, at(3), click("/", "10:00:30"))
	permanent(t, err, sqlproc.ReasonLate, "event time 2026-12-01T10:00:30Z is behind the watermark 2026-12-01T10:01:50Z (the largest event time seen, 2026-12-01T10:02:00Z, less the lateness 10s): its windows have closed")

	// late: count: counted, nothing else changes.
	s = openStore(t, nil)
	p = newProc(t, clicksConfig(func(w *sqlproc.Window) { w.Late = sqlproc.LateCount }))
	setup(t, s, p)
	for i, hms := range []string{"10:00:05", "10:02:00", "10:00:30", "10:00:59"} {
		if err := applyItem(t, s, p, at(int64(i+1)), click("/", hms)); err != nil {
			t.Fatal(err)
		}
	}
	if m, late := watermarkRow(t, s); m != "10:02:00" || late != 2 {
		t.Fatalf("watermark row = %s, %d late, want 10:02:00, 2", m, late)
	}
	if got := windowRows(t, s); !reflect.DeepEqual(got, []string{"/ 10:02:00 1"}) {
		t.Fatalf("windows = %q", got)
	}
	if got := keyValues(t, s); len(got) != 1 {
		t.Fatalf("outputs = %q, want the window 10:00 once", got)
	}
}

func TestWindow_Hopping(t *testing.T) {
	s := openStore(t, nil)
	p := newProc(t, clicksConfig(func(w *sqlproc.Window) { w.Hop = 30 * time.Second; w.Lateness = 0 }))
	setup(t, s, p)
	for i, hms := range []string{"10:00:40", "10:00:10", "10:01:05", "10:02:30"} {
		if err := applyItem(t, s, p, at(int64(i+1)), click("/", hms)); err != nil {
			t.Fatalf("%s: %v", hms, err)
		}
	}
	// 10:00:40 counts in [10:00:00, 10:01:00) and [10:00:30, 10:01:30);
	// 10:00:10 only in [10:00:00, 10:01:00): [09:59:30, 10:00:30) has
	// closed; 10:02:30 in [10:02:00, 10:03:00) and [10:02:30, 10:03:30).
	want := []string{
		`/ {"page":"/","window":"10:00:00","end":"10:01:00","clicks":2}`,
		`/ {"page":"/","window":"10:00:30","end":"10:01:30","clicks":2}`,
		`/ {"page":"/","window":"10:01:00","end":"10:02:00","clicks":1}`,
	}
	if got := keyValues(t, s); !reflect.DeepEqual(got, want) {
		t.Fatalf("outputs:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := windowRows(t, s); !reflect.DeepEqual(got, []string{"/ 10:02:00 1", "/ 10:02:30 1"}) {
		t.Fatalf("windows = %q", got)
	}
}

func TestWindow_BadOutput(t *testing.T) {
	s := openStore(t, nil)
	c := clicksConfig()
	if err := s.RegisterFeed(context.Background(), outbox.FeedInfo{Name: "f", Kind: "file", Source: "f", Processor: "clicks"}); err != nil {
		t.Fatal(err)
	}
	c.Emit = "SELECT page AS key, CASE WHEN page = '/bad' THEN 1.5 ELSE clicks END AS value FROM click_windows WHERE window_start = :window_start ORDER BY page"
	p := newProc(t, c)
	setup(t, s, p)
	for i, l := range []struct{ page, at string }{{"/", "10:00:05"}, {"/bad", "10:00:06"}, {"/", "10:01:05"}, {"/", "10:02:30"}} {
		if err := applyItem(t, s, p, at(int64(i+1)), click(l.page, l.at)); err != nil {
			t.Fatal(err)
		}
	}
	if got := keyValues(t, s); !reflect.DeepEqual(got, []string{"/ 1"}) {
		t.Fatalf("outputs = %q, want the window 10:01 only", got)
	}
	dls, err := s.DeadLetters(context.Background(), "f", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].Reason != sqlproc.ReasonBadOutput || string(dls[0].Payload) != `{"processor":"clicks","window_end":1796119260,"window_start":1796119200}` ||
		dls[0].Error != "window [2026-12-01T10:00:00Z, 2026-12-01T10:01:00Z): emit (SELECT page AS key, CASE WHEN page = '/bad' THEN ...): row 2: value: 1.5 is REAL: CAST it to TEXT or use printf()" {
		t.Fatalf("dead letters = %+v", dls)
	}
	if got := windowRows(t, s); !reflect.DeepEqual(got, []string{"/ 10:02:00 1"}) {
		t.Fatalf("windows = %q: the bad window is compacted too", got)
	}
}

func TestWindow_Config(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  sqlproc.Config
		want string
	}{
		{"NoTime", clicksConfig(func(w *sqlproc.Window) { w.Time = "" }), "sqlproc clicks: window: time: missing: an SQL expression giving the item's event time in Unix seconds"},
		{"NoSize", clicksConfig(func(w *sqlproc.Window) { w.Size = 0 }), "sqlproc clicks: window: size 0s: want a positive duration"},
		{"Fraction", clicksConfig(func(w *sqlproc.Window) { w.Size = 1500 * time.Millisecond }), "sqlproc clicks: window: size 1.5s: want whole seconds"},
		{"HopLong", clicksConfig(func(w *sqlproc.Window) { w.Hop = 2 * time.Minute }), "sqlproc clicks: window: hop 2m0s is longer than size 1m0s: items between windows would count nowhere"},
		{"Late", clicksConfig(func(w *sqlproc.Window) { w.Late = "drop" }), `sqlproc clicks: window: late: "drop" is not one of dead-letter, count`},
		{"Table", clicksConfig(func(w *sqlproc.Window) { w.Table = "x; DROP" }), `sqlproc clicks: window: table "x; DROP": want the name of the table holding the windows' state (letters, digits, _)`},
		{"NoTable", clicksConfig(func(w *sqlproc.Window) { w.Table = "nope" }), "sqlproc clicks: window: table nope: no such table (setup makes it)"},
		{"NoColumn", func() sqlproc.Config {
			c := clicksConfig()
			c.Setup = "CREATE TABLE IF NOT EXISTS click_windows (page TEXT, w INTEGER, clicks INTEGER);"
			c.Apply = "INSERT INTO click_windows VALUES (:page, :window_start, 1)"
			c.Emit = "SELECT page AS key, clicks AS value FROM click_windows WHERE w = :window_start"
			return c
		}(), "sqlproc clicks: window: table click_windows has no column window_start (its columns: page, w, clicks)"},
		{"EmitItemParam", func() sqlproc.Config {
			c := clicksConfig()
			c.Emit = "SELECT :page AS key, 1 AS value"
			return c
		}(), "sqlproc clicks: emit (SELECT :page AS key, 1 AS value): unknown parameter :page (known: :window_start, :window_end)"},
		{"RejectWindowParam", func() sqlproc.Config {
			c := clicksConfig()
			c.Reject = "SELECT 'x' WHERE :window_start IS NULL"
			return c
		}(), "sqlproc clicks: reject (SELECT 'x' WHERE :window_start IS NULL): unknown parameter :window_start (known: :feed, :partition, :topic, :epoch, :position, :sequence, :attempt, :key, :value, :headers, :at, :page)"},
		{"TimeTwoColumns", clicksConfig(func(w *sqlproc.Window) { w.Time = "1), (2" }), "sqlproc clicks: window.time (SELECT (1), (2)): returns 2 columns, want the event time"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := sqlproc.New(c.cfg)
			if err == nil || err.Error() != c.want {
				t.Fatalf("New = %v\nwant  %s", err, c.want)
			}
		})
	}
}

func TestWindow_BadTime(t *testing.T) {
	s := openStore(t, nil)
	p := newProc(t, clicksConfig())
	setup(t, s, p)
	err := applyItem(t, s, p, at(1), line(`{"page":"/","at":"yesterday"}`))
	permanent(t, err, ingest.ReasonMalformed, "window time is NULL: the item has no event time")
	p = newProc(t, clicksConfig(func(w *sqlproc.Window) { w.Time = ":at" }))
	err = applyItem(t, s, p, at(2), line(`{"page":"/","at":"yesterday"}`))
	permanent(t, err, ingest.ReasonMalformed, `window time "yesterday" is not a number of Unix seconds`)
}
