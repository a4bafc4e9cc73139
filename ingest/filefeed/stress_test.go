//go:build stress

// The rotation-storm stress: a writer rotates and copytruncates the file
// with 0-5 ms pauses while the feed is polled in-process. Every copy is
// kept, so every line must be delivered exactly once and no loss recorded:
// a round fails on a line missing or read twice, and on any loss. Each
// failing round prints its operations and what was read in each epoch, and
// the test ends with how many rounds failed. It depends on timing and is
// kept out of the suite: go test -tags stress -run TestStress_RotationStorm ./ingest/filefeed/

package filefeed

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

func TestStress_RotationStorm(t *testing.T) {
	const rounds = 200
	failed := 0
	defer func() { t.Logf("%d of %d rounds failed", failed, rounds) }()
	for round := range rounds {
		ff := ffNewFile(t)
		rng := rand.New(rand.NewPCG(uint64(round), 7))
		gen := 0
		var lines []string
		var ops []string
		ino := func(name string) string {
			fi, err := os.Stat(name)
			if err != nil {
				return "none"
			}
			return fileIDOf(fi).String()
		}
		writeN := func(n int) {
			var b []byte
			for i := range n {
				l := fmt.Sprintf("g%d-l%d", gen, i)
				lines = append(lines, l)
				b = append(b, l+"\n"...)
			}
			for len(b) > 0 {
				cut := min(len(b), 1+rng.IntN(200))
				cut += strings.IndexByte(string(b[cut-1:]), '\n')
				ff.write(string(b[:cut]))
				b = b[cut:]
			}
			ops = append(ops, fmt.Sprintf("g%d -> %s", gen, ino(ff.path)))
			gen++
		}
		writeN(5)
		got := map[string]int{}
		f := ff.open(outbox.Checkpoint{})
		first, _ := ffPollN(f, 6, 0)
		for _, r := range first {
			if r.Kind == ingest.RecordItem {
				got[string(r.Item.Value)]++
			}
		}
		done := make(chan struct{})
		wrng := rand.New(rand.NewPCG(uint64(round), 8))
		go func() {
			defer close(done)
			rng := wrng
			for range 15 {
				for range 1 + rng.IntN(4) {
					writeN(5 + rng.IntN(50))
					if rng.IntN(4) == 0 {
						data, _ := os.ReadFile(ff.path)
						n := 0
						for {
							if _, err := os.Stat(ff.path + "." + strconv.Itoa(n+1)); err != nil {
								break
							}
							n++
						}
						for ; n >= 1; n-- {
							os.Rename(ff.path+"."+strconv.Itoa(n), ff.path+"."+strconv.Itoa(n+1))
						}
						os.WriteFile(ff.path+".1", data, 0o644)
						os.Truncate(ff.path, 0)
						ops = append(ops, "copytruncate to "+ino(ff.path+".1"))
					} else {
						ff.rotate()
						ops = append(ops, "rotate")
					}
				}
				writeN(5 + rng.IntN(50))
				time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
			}
		}()
		var losses []string
		var trace [][3]string
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		var recs []ingest.Record
		writing := true
		for {
			select {
			case <-done:
				writing = false
			default:
			}
			before := len(recs)
			pctx, pc := context.WithTimeout(ctx, 300*time.Millisecond)
			var err error
			recs, err = f.Poll(pctx, recs, 1+rng.IntN(20))
			pc()
			for _, r := range recs[before:] {
				switch r.Kind {
				case ingest.RecordItem:
					got[string(r.Item.Value)]++
					if len(trace) == 0 || trace[len(trace)-1][0] != r.Epoch {
						trace = append(trace, [3]string{r.Epoch, string(r.Item.Value), ""})
					}
					trace[len(trace)-1][2] = string(r.Item.Value)
				case ingest.RecordLoss:
					losses = append(losses, ffDescribe(r))
				}
			}
			if err != nil && !writing {
				break
			}
		}
		cancel()
		var missing []string
		bad := map[string]bool{}
		for _, l := range lines {
			g := l[:strings.Index(l, "-")]
			if got[l] != 1 && !bad[g] {
				bad[g] = true
				missing = append(missing, fmt.Sprintf("%s:%d", l, got[l]))
			}
		}
		if len(missing) > 0 || len(losses) > 0 {
			t.Logf("ops: %v", ops)
			for _, x := range trace {
				t.Logf("%s: %s .. %s", x[0], x[1], x[2])
			}
			t.Errorf("round %d: %d lines wrong (%v), losses %v", round, len(missing), missing[:min(20, len(missing))], losses)
			failed++
		}
		f.Close()
	}
}
