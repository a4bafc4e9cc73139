package bench

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/relay"
)

// bitset is a set of small non-negative integers.
type bitset []uint64

func newBitset(n int64) bitset { return make(bitset, n/64+1) }

// set adds i and reports whether it was already there.
func (s bitset) set(i int64) (had bool) {
	w, m := i/64, uint64(1)<<(i%64)
	had = s[w]&m != 0
	s[w] |= m
	return had
}

func (s bitset) has(i int64) bool { return s[i/64]&(uint64(1)<<(i%64)) != 0 }

// lastOutput is the output of an account's latest line seen.
type lastOutput struct {
	position int64
	value    []byte
}

// outputCheck follows what a consumer sees of the file's outputs: which
// line positions arrived (a bitset over the file's bytes: memory is an
// eighth of the file's size) and how often; for the ledger each account's
// latest output, for forward a checksum of the values (the sum of their
// hashes, which any changed byte changes). add runs on the consumer's
// goroutine; the other methods that read the counts run after the consumer
// has stopped, except the is* and channel ones, which are safe at any time.
type outputCheck struct {
	want      int64
	ledger    bool
	seen      bitset
	last      map[string]lastOutput
	valueHash uint64
	stats     checkStats

	mu       sync.Mutex
	distinct int64
	ends     int32
	complete chan struct{} // closed once every line's output was seen
	ended    chan struct{} // closed once every partition's end marker was seen
}

// checkStats are the anomalies counted.
type checkStats struct {
	duplicates int64 // a position seen again
	foreign    int64 // no position header, or one past the file
}

// newOutputCheck expects one output per line of d, made by processor.
func newOutputCheck(d lineData, processor string) *outputCheck {
	return &outputCheck{want: d.Lines, ledger: processor == "ledger", seen: newBitset(d.Size + 1),
		last: map[string]lastOutput{}, complete: make(chan struct{}), ended: make(chan struct{})}
}

// valueHash is the hash the forward check sums.
func valueHash(v []byte) uint64 {
	h := fnv.New64a()
	h.Write(v)
	return h.Sum64()
}

// add takes one consumed record.
func (c *outputCheck) add(r *kgo.Record, _ time.Time) {
	if string(r.Value) == endMarker {
		c.addEnd()
		return
	}
	pos, ok := recordPosition(r)
	if !ok || pos < 0 || pos >= int64(len(c.seen))*64 {
		c.stats.foreign++
		return
	}
	if c.seen.set(pos) {
		c.stats.duplicates++
		return
	}
	if !c.ledger {
		c.valueHash += valueHash(r.Value)
	} else if l, ok := c.last[string(r.Key)]; !ok || pos > l.position {
		// Copied into the account's own buffer: the record's bytes belong
		// to a whole fetch, which keeping them would pin.
		c.last[string(r.Key)] = lastOutput{position: pos, value: append(l.value[:0], r.Value...)}
	}
	c.mu.Lock()
	c.distinct++
	if c.distinct == c.want {
		close(c.complete)
	}
	c.mu.Unlock()
}

func (c *outputCheck) addEnd() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ends++; c.ends == topicPartitions {
		close(c.ended)
	}
}

// isComplete reports whether every line's output was seen.
func (c *outputCheck) isComplete() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.distinct >= c.want
}

// isEnded reports whether every partition was read to its end marker.
func (c *outputCheck) isEnded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ends >= topicPartitions
}

// recordPosition is the record's outboxd-position header.
func recordPosition(r *kgo.Record) (int64, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == relay.HeaderPosition {
			n, err := strconv.ParseInt(string(r.Headers[i].Value), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// verify records in v whether each line of d was seen exactly once and,
// for the ledger, each account's last output carries its expected balance,
// for forward, the values are the lines. Call it once the consumer has
// stopped.
func (c *outputCheck) verify(d lineData, v *verifyResult) {
	v.Outputs, v.Duplicates, v.Foreign = c.distinct, c.stats.duplicates, c.stats.foreign
	g := d.gen()
	var want uint64
	for range d.Lines {
		l, text := g.next()
		if !c.seen.has(l.Position) {
			v.Missing++
		}
		want += valueHash(text[:len(text)-1])
	}
	if v.Missing > 0 || v.Duplicates > 0 || v.Foreign > 0 {
		v.fail("end_to_end: %d lines without an output, %d duplicate outputs, %d outputs of no line",
			v.Missing, v.Duplicates, v.Foreign)
	}
	if !c.ledger {
		if v.Missing == 0 && c.valueHash != want {
			v.fail("end_to_end: the outputs' values are not the lines (checksum %x, want %x)", c.valueHash, want)
		}
		return
	}
	if d.Sums != nil {
		c.verifyLastBalances(d, v)
	}
}

// verifyLastBalances checks each account's latest output against the sum
// of its lines.
func (c *outputCheck) verifyLastBalances(d lineData, v *verifyResult) {
	bad := 0
	for i := range d.Accounts {
		if d.Counts[i] == 0 {
			continue
		}
		name := accountName(i)
		var out ledger.Output
		l, ok := c.last[name]
		if !ok || json.Unmarshal(l.value, &out) != nil || out.Balance != d.Sums[i] {
			if bad++; bad <= 3 {
				v.fail("end_to_end: the last output of %s has balance %d, want %d", name, out.Balance, d.Sums[i])
			}
		}
	}
	if bad > 3 {
		v.fail("end_to_end: %d accounts in all have a wrong last balance", bad)
	}
}

// verifyBalances checks the balances the engine stored.
func (b *bench) verifyBalances(ctx context.Context, w *watcher) error {
	got, err := ledger.Balances(ctx, w.store, benchFeed)
	if err != nil {
		return err
	}
	v, bad := &b.res.Verify, 0
	for i := range b.data.Accounts {
		if b.data.Counts[i] == 0 {
			continue
		}
		name := accountName(i)
		v.BalancesChecked++
		if got[name] != b.data.Sums[i] {
			if bad++; bad <= 3 {
				v.fail("end_to_end: SQLite's balance of %s is %d, want %d", name, got[name], b.data.Sums[i])
			}
		}
	}
	if bad > 3 {
		v.fail("end_to_end: %d balances in all are wrong in SQLite", bad)
	}
	return nil
}
