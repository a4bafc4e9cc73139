package ingest_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// sizedFeed is a memFeed that says how large its items can be.
type sizedFeed struct {
	*memFeed
	maxItem int
}

func (f sizedFeed) MaxItemBytes() int { return f.maxItem }

// A batch closes once its items hold BatchBytes, and never holds more than
// that plus one item: the loop asks the feed for no more records than fit
// were each as large as the feed's largest.
func TestLoop_BatchBytes(t *testing.T) {
	const item, maxItem, budget = 3 << 10, 4 << 10, 10 << 10
	var values []string
	for i := range 20 {
		values = append(values, fmt.Sprintf("%02d", i)+strings.Repeat("x", item-2))
	}
	s := outboxtest.TempStore(t)
	f := sizedFeed{newMemFeed("e", values...), maxItem}
	var mu sync.Mutex
	var sizes []int
	cfg := testConfig()
	cfg.BatchMax, cfg.BatchBytes, cfg.BatchWait = 1000, budget, time.Second
	cfg.OnBatch = func(records int, _ time.Duration) {
		mu.Lock()
		sizes = append(sizes, records)
		mu.Unlock()
	}
	_, stop := running(t, s, f, newCounter(), cfg)
	wait(t, 10*time.Second, positionIs(s, "f", "e", 20))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The epoch record, then four items at a time: 2 fit the empty batch's
	// budget, 1 more, then 1 while 1 KiB is left (12 KiB <= 10 + 4 KiB).
	if want := []int{1, 4, 4, 4, 4, 4}; !slices.Equal(sizes, want) {
		t.Fatalf("batch sizes = %v, want %v", sizes, want)
	}
	equal(t, "applied", stats(t, s).Applied, int64(20))
}

func TestConfig_ValidateBatchBytes(t *testing.T) {
	cfg := ingest.DefaultConfig("f")
	equal(t, "default batch bytes", cfg.BatchBytes, ingest.DefaultBatchBytes)
	cfg.BatchBytes = -1
	err := cfg.Validate()
	if err == nil || err.Error() != "batch-bytes: -1 is negative" {
		t.Fatalf("Validate() = %v", err)
	}
}
