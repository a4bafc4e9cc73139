package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestHistory_Rates: rates come from the samples' own times (the store's
// clock, virtual here), not from when they were asked for; a feed known
// later has nulls before; ?since returns the later samples only.
func TestHistory_Rates(t *testing.T) {
	h := newHistory()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	feed := func(name, kind string, applied, lag, dead int64) FeedStatus {
		return FeedStatus{Feed: name, Kind: kind, Applied: applied, Lag: lag, DeadLettered: dead}
	}
	h.add(t0, []FeedStatus{feed("f", "file", 100, 40, 0)}, OutboxStatus{LastPublishedID: 10, Pending: 5})
	// 4 s of virtual time in one step: 400 items, 40 rows: 100/s and 10/s.
	h.add(t0.Add(4*time.Second), []FeedStatus{feed("f", "file", 500, 0, 2), feed("k", "kafka", 7, 3, 0)},
		OutboxStatus{LastPublishedID: 50, Pending: 1, PendingBytes: 90, OldestPendingAge: 0.5})
	j := h.json(0)
	if got := fmt.Sprint(j.Times); got != fmt.Sprint([]int64{t0.UnixMilli(), t0.Add(4 * time.Second).UnixMilli()}) {
		t.Fatalf("times %s", got)
	}
	b, _ := json.Marshal(j)
	for _, want := range []string{
		`"publishedPerSecond":[null,10]`, `"pending":[5,1]`, `"pendingBytes":[0,90]`,
		`{"feed":"f","kind":"file","lagUnit":"bytes","appliedPerSecond":[null,100],"deadLetters":[null,2],"lag":[40,0],"pending":[0,0]}`,
		`{"feed":"k","kind":"kafka","lagUnit":"records","appliedPerSecond":[null,null],"deadLetters":[null,null],"lag":[null,3],"pending":[null,0]}`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("history %s\nlacks %s", b, want)
		}
	}
	later := h.json(t0.UnixMilli())
	if len(later.Times) != 1 || *later.Feeds[0].AppliedPerSecond[0] != 100 {
		t.Fatalf("since the first sample: %+v", later)
	}
	// The clock standing still: the newer reading replaces the sample.
	h.add(t0.Add(4*time.Second), []FeedStatus{feed("f", "file", 600, 0, 2)}, OutboxStatus{LastPublishedID: 50})
	if j := h.json(0); len(j.Times) != 2 || *j.Feeds[0].AppliedPerSecond[1] != 125 {
		t.Fatalf("after a sample at the same time: %d samples, rate %v", len(j.Times), *j.Feeds[0].AppliedPerSecond[1])
	}
}

// TestHistory_Bounded: whatever the number of feeds, an answer stays within
// HistoryMaxBytes: with many feeds fewer samples are kept.
func TestHistory_Bounded(t *testing.T) {
	for _, n := range []int{1, 200} {
		h := newHistory()
		var feeds []FeedStatus
		for i := range n {
			feeds = append(feeds, FeedStatus{Feed: fmt.Sprintf("feed-%03d-%s", i, strings.Repeat("x", 40)), Kind: "kafka",
				Applied: 1 << 62, Lag: 1 << 62, DeadLettered: 1 << 62})
		}
		t0 := time.Unix(1<<32, 0)
		for i := range historySamples + 10 {
			for j := range feeds {
				feeds[j].Applied -= int64(i) * 1e9 // large rates, long numbers
			}
			h.add(t0.Add(time.Duration(i)*time.Second), feeds, OutboxStatus{LastPublishedID: 1 << 62, Pending: 1 << 62, PendingBytes: 1 << 62, OldestPendingAge: 1e300})
		}
		b, err := json.Marshal(h.json(0))
		if err != nil {
			t.Fatal(err)
		}
		kept := len(h.samples)
		t.Logf("%d feeds: %d samples kept, answer %d bytes", n, kept, len(b))
		if len(b) > HistoryMaxBytes {
			t.Errorf("%d feeds: answer of %d bytes, over %d", n, len(b), HistoryMaxBytes)
		}
		if n == 1 && kept != historySamples {
			t.Errorf("1 feed: %d samples kept, want %d (15 minutes)", kept, historySamples)
		}
		if n == 200 && kept >= historySamples {
			t.Errorf("200 feeds: %d samples kept, want fewer than %d", kept, historySamples)
		}
	}
}
