package tests

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// clicksFile is input for examples/windows.yaml and what it must give.
type clicksFile struct {
	data string
	// outputs are the windows' final results as "key value", in the
	// order they close (start, then page); closed: only the windows the
	// last click's watermark closed.
	outputs []string
	// counts are the clicks per "page window" of the closed windows.
	counts map[string]int
	dead   []string // "position reason"
}

var windowPages = []string{"/", "/cart", "/a&b", "/ü"}

// windowedValue is the example's value for a window's count.
func windowedValue(page string, start int64, clicks int) string {
	v, _ := json.Marshal(struct {
		Page   string `json:"page"`
		Window string `json:"window"`
		Clicks int    `json:"clicks"`
	}{page, time.Unix(start, 0).UTC().Format(time.RFC3339), clicks})
	return strings.ReplaceAll(string(v), `\u0026`, "&")
}

// makeClicks makes n click lines whose times move forward over about
// minutes minutes, each behind the latest by up to 45s (the lateness is
// 30s: some late), some in another zone or with a fraction of a second,
// some malformed; and the model of what examples/windows.yaml does with
// them: a window [s, s+60) is open while s+60 > latest-30; a click whose
// window has closed is late; when the watermark passes a window's end,
// its counts are published, pages in byte order.
func makeClicks(rng *rand.Rand, n, minutes int) clicksFile {
	const size, lateness = 60, 30
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	bad := []string{`{"page":"/"}`, `{"at":"2026-12-01T10:00:00Z"}`, `{"page":"/","at":"yesterday"}`,
		`{"page":5,"at":"2026-12-01T10:00:00Z"}`, `{"page":"/","at":"2026-12-01 10:00:00"}`, `nope`}
	cf := clicksFile{counts: map[string]int{}}
	open := map[int64]map[string]int{}
	var b strings.Builder
	var latest int64 = -1 << 62
	span := time.Duration(minutes) * time.Minute
	for i := range n {
		if rng.IntN(40) == 0 {
			b.WriteString(bad[rng.IntN(len(bad))] + "\n")
			cf.dead = append(cf.dead, fmt.Sprintf("%d malformed", b.Len()))
			continue
		}
		page := windowPages[rng.IntN(len(windowPages))]
		at := base.Add(span*time.Duration(i)/time.Duration(n) - time.Duration(rng.IntN(45_000))*time.Millisecond)
		if i == n-1 {
			at = base.Add(span + time.Hour) // closes every window but its own
		}
		stamp := at.Format(time.RFC3339Nano)
		if rng.IntN(4) == 0 {
			stamp = at.In(time.FixedZone("", 2*3600)).Format(time.RFC3339Nano)
		}
		fmt.Fprintf(&b, `{"page":%q,"at":%q}`+"\n", page, stamp)
		t := at.Unix()
		start := t - t%size
		wm := max(latest, t) - lateness
		if start+size <= wm {
			cf.dead = append(cf.dead, fmt.Sprintf("%d late", b.Len()))
			continue
		}
		if open[start] == nil {
			open[start] = map[string]int{}
		}
		open[start][page]++
		if t <= latest {
			continue
		}
		latest = t
		var closing []int64
		for s := range open {
			if s+size <= wm {
				closing = append(closing, s)
			}
		}
		slices.Sort(closing)
		for _, s := range closing {
			pages := make([]string, 0, len(open[s]))
			for p := range open[s] {
				pages = append(pages, p)
			}
			slices.Sort(pages)
			for _, p := range pages {
				cf.outputs = append(cf.outputs, p+" "+windowedValue(p, s, open[s][p]))
				cf.counts[p+" "+time.Unix(s, 0).UTC().Format(time.RFC3339)] = open[s][p]
			}
			delete(open, s)
		}
	}
	cf.data = b.String()
	return cf
}

// TestSQLWindows_KillNine: examples/windows.yaml on a file appended to
// while the server is killed with SIGKILL at random moments, its relay
// publishing to a Kafka broker: a read_committed reader of
// clicks.per-minute finds every closed window's count per page exactly
// once, with the exact count, and the late clicks' dead letters are
// exactly the model's.
func TestSQLWindows_KillNine(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 26))
	cf := makeClicks(rng, 30_000, 240)
	late := 0
	for _, d := range cf.dead {
		if strings.HasSuffix(d, " late") {
			late++
		}
	}
	if len(cf.counts) < 500 || late < 100 {
		t.Fatalf("the input has %d windowed counts and %d late clicks: too few to test", len(cf.counts), late)
	}
	broker := startBroker(t)
	dir := t.TempDir()
	input, db := filepath.Join(dir, "clicks.jsonl"), filepath.Join(dir, "outboxd.db")
	args := []string{"--config", example("windows.yaml"), "--db", db, "--feed", "clicks=file:" + input,
		"--brokers", broker, "--http", "127.0.0.1:0"}
	t0 := time.Now()
	writing := appendSlowly(t, input, []byte(cf.data), 6*time.Second, rng)
	kills := 0
	for ; kills < 16; kills++ {
		p := start(t, nil, args...)
		time.Sleep(time.Duration(50+rng.IntN(500)) * time.Millisecond) // a random moment to crash at
		p.kill()
	}
	<-writing
	t.Logf("%d kill -9s while %d bytes were appended (%v)", kills, len(cf.data), time.Since(t0))

	p := start(t, nil, args...)
	waitRunning(t, p)
	waitPosition(t, db, "clicks", int64(len(cf.data)))
	s := readStore(t, db)
	wait(t, 90*time.Second, func() error { return relayDone(t.Context(), s) })
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if got := keyValues(allRows(t, s), "clicks.per-minute"); !reflect.DeepEqual(got, cf.outputs) {
		for i := range min(len(got), len(cf.outputs)) {
			if got[i] != cf.outputs[i] {
				t.Fatalf("outbox row %d of %d/%d: %s, want %s", i, len(got), len(cf.outputs), got[i], cf.outputs[i])
			}
		}
		t.Fatalf("%d outbox rows, want %d", len(got), len(cf.outputs))
	}
	published := map[string]int{}
	for _, c := range readAll(t, broker, "clicks.per-minute")["clicks.per-minute"] {
		var v struct {
			Page   string `json:"page"`
			Window string `json:"window"`
			Clicks int    `json:"clicks"`
		}
		if err := json.Unmarshal([]byte(c.Value), &v); err != nil || v.Page != c.Key {
			t.Fatalf("record %s %q: %v", c.Key, c.Value, err)
		}
		k := v.Page + " " + v.Window
		if _, twice := published[k]; twice {
			t.Fatalf("window %s published twice", k)
		}
		published[k] = v.Clicks
	}
	if !reflect.DeepEqual(published, cf.counts) {
		for k, n := range cf.counts {
			if published[k] != n {
				t.Fatalf("window %s: published %d clicks, want %d (%d windows published, %d want)", k, published[k], n, len(published), len(cf.counts))
			}
		}
		t.Fatalf("%d windows published, want %d", len(published), len(cf.counts))
	}
	if got := deadReasons(t, s, "clicks"); !reflect.DeepEqual(got, cf.dead) {
		t.Fatalf("%d dead letters, want %d:\n%q\nwant\n%q", len(got), len(cf.dead), got, cf.dead)
	}
	t.Logf("%d windowed counts published once each, %d late and %d malformed clicks dead-lettered (%v)",
		len(cf.counts), late, len(cf.dead)-late, time.Since(t0))
}
