package recording_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/ingest/recording"
)

// parts records one run of a ledger feed in parts of the smallest size
// and returns a copy of the parts in a directory of their own, in order.
func parts(t *testing.T) (dir string, paths []string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(14, 14))
	root := t.TempDir()
	r := run{dir: filepath.Join(root, "rec"), db: filepath.Join(root, "live.db"), input: filepath.Join(root, "ledger.csv"),
		maxBytes: recording.MinMaxBytes}
	appendFile(t, r.input, lines(rng, 8000))
	r.record(t)
	paths = recordings(t, r.dir)
	slices.Sort(paths)
	if len(paths) < 4 {
		t.Fatalf("%d parts, want 4 or more", len(paths))
	}
	return r.dir, paths
}

// copyParts copies paths into a new directory, f changing each file's
// bytes (f may return nil: the file is left out), and returns the copies'
// paths.
func copyParts(t *testing.T, paths []string, f func(i int, data []byte) []byte) []string {
	t.Helper()
	dir := t.TempDir()
	var out []string
	for i, p := range paths {
		data := f(i, mustRead(t, p))
		if data == nil {
			continue
		}
		q := filepath.Join(dir, filepath.Base(p))
		if err := os.WriteFile(q, data, 0o644); err != nil {
			t.Fatal(err)
		}
		out = append(out, q)
	}
	return out
}

// tailOf reads path whole and returns its tail.
func tailOf(t *testing.T, path string) recording.Tail {
	t.Helper()
	set, err := recording.Scan([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	return set.Files[0].Tail
}

// TestScan_Damage: every part of a run names its successor and the last
// ends the run; damage at a part's end is reported with the file and the
// byte offset, never taken for a crash's tail, and parts gone are seen.
func TestScan_Damage(t *testing.T) {
	dir, paths := parts(t)
	last := len(paths) - 1
	tails := make([]recording.Tail, len(paths))
	for i, p := range paths {
		tails[i] = tailOf(t, p)
		next := fmt.Sprintf("%s-%04d.rec", filepath.Base(p)[:len(filepath.Base(p))-len("0001.rec")-1], i+2)
		switch {
		case i < last && (tails[i].Next != next || tails[i].NextPart != i+2 || tails[i].Ended || tails[i].Bytes != 0):
			t.Fatalf("part %d: tail %+v, want it to name %s", i+1, tails[i], next)
		case i == last && (!tails[i].Ended || tails[i].Next != "" || tails[i].Bytes != 0):
			t.Fatalf("last part: tail %+v, want the run's end", tails[i])
		}
	}
	if _, err := recording.Scan([]string{dir}); err != nil {
		t.Fatalf("the whole run: %v", err)
	}
	// A replay of the first parts, the others still beside them.
	if _, err := recording.Scan(paths[:2]); err != nil {
		t.Fatalf("the first two parts: %v", err)
	}
	// commitAt is where the commit record before the end of part i starts.
	commitAt := func(i int) int64 {
		last, _ := lastTxn(t, paths[i])
		return tails[i].EndOffset - int64(2+4+4+1+len(binary.AppendUvarint(nil, last.Number)))
	}
	scan := func(t *testing.T, ps []string, want string, is error) {
		t.Helper()
		_, err := recording.Scan(ps)
		if !errors.Is(err, is) || !recording.IsBad(err) || err.Error() != want {
			t.Fatalf("err %v\nwant %q (%v)", err, want, is)
		}
	}

	t.Run("MiddleCommitDamaged", func(t *testing.T) {
		at := commitAt(1)
		ps := copyParts(t, paths, func(i int, b []byte) []byte {
			if i == 1 {
				b[at+frameBody] ^= 0x55
			}
			return b
		})
		scan(t, ps, fmt.Sprintf("recording %s: recording damaged: offset %d: a record whose checksum does not match, yet a whole record follows at offset %d",
			ps[1], at, tails[1].EndOffset), recording.ErrCorrupt)
	})
	t.Run("MiddleEndCutOff", func(t *testing.T) {
		// The commit record and the next-part record gone: the part ends
		// unconfirmed, yet its successor follows.
		at := commitAt(1)
		ps := copyParts(t, paths, func(i int, b []byte) []byte {
			if i == 1 {
				return b[:at]
			}
			return b
		})
		last, _ := lastTxn(t, paths[1])
		scan(t, ps, fmt.Sprintf("recording %s: recording damaged: offset %d: the part ends without naming the part that follows it "+
			"(transaction %d has no commit record), yet %s is part 3 of its run",
			ps[1], last.Offset, last.Number, ps[2]), recording.ErrCorrupt)
	})
	t.Run("CrashBeforeNamingNext", func(t *testing.T) {
		// The next part made, the process killed before it named it: the
		// part ends after its last commit, and the set joins.
		ps := copyParts(t, paths, func(i int, b []byte) []byte {
			if i == 1 {
				return b[:tails[1].EndOffset]
			}
			return b
		})
		if _, err := recording.Scan(ps); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("MiddleCutAtATransaction", func(t *testing.T) {
		// Cut right after its first transaction: whole records, yet the
		// next part does not start where it now ends.
		rd, err := recording.Open(paths[1])
		if err != nil {
			t.Fatal(err)
		}
		first, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		second, err := rd.Next()
		rd.Close()
		if err != nil {
			t.Fatal(err)
		}
		ps := copyParts(t, paths, func(i int, b []byte) []byte {
			if i == 1 {
				return b[:second.Offset]
			}
			return b
		})
		_, err = recording.Scan(ps)
		if !errors.Is(err, recording.ErrBadSet) || !strings.Contains(err.Error(),
			fmt.Sprintf("%s ends at [0] epoch %s position %d (its last transaction ends at offset %d), but %s starts at",
				ps[1], first.Checkpoints[0].Epoch, first.Checkpoints[0].Position, second.Offset, ps[2])) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("FinalLastFrameDamaged", func(t *testing.T) {
		end := tails[last].EndOffset
		size := int64(len(mustRead(t, paths[last])))
		for _, tc := range []struct {
			name   string
			damage func([]byte) []byte
			why    string
		}{
			{"ByteFlipped", func(b []byte) []byte { b[len(b)-1] ^= 1; return b }, "a record whose checksum does not match: a crash cuts a record short, it does not change one"},
			{"LengthFlipped", func(b []byte) []byte { b[end+3] ^= 0x10; return b },
				"a end-of-run record cut short, which is written after the last transaction, whole, by a write of its own: a crash does not cut it"},
			{"CutShort", func(b []byte) []byte { return b[:len(b)-3] },
				"a end-of-run record cut short, which is written after the last transaction, whole, by a write of its own: a crash does not cut it"},
			{"SyncGone", func(b []byte) []byte { b[end] = 0; return b }, "not the start of a record: a crash cuts a record short, it does not change one"},
			{"BytesAfter", func(b []byte) []byte { return append(b, 0xA7) },
				fmt.Sprintf("a record cut short after the end of the part at offset %d", end)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ps := copyParts(t, paths, func(i int, b []byte) []byte {
					if i == last {
						return tc.damage(b)
					}
					return b
				})
				at := end
				if tc.name == "BytesAfter" {
					at = size
				}
				scan(t, ps, fmt.Sprintf("recording %s: recording damaged: offset %d: %s", ps[last], at, tc.why), recording.ErrCorrupt)
			})
		}
		// The last commit record damaged, the end whole after it (when the
		// last part holds a transaction: the run may have ended right
		// after a part was closed).
		if lt, _ := lastTxn(t, paths[last]); lt.Number == 0 {
			t.Logf("the last part holds no transaction: its commit is not damaged")
			return
		}
		at := commitAt(last)
		ps := copyParts(t, paths, func(i int, b []byte) []byte {
			if i == last {
				b[at+frameBody] ^= 0x55
			}
			return b
		})
		scan(t, ps, fmt.Sprintf("recording %s: recording damaged: offset %d: a record whose checksum does not match, yet a whole record follows at offset %d",
			ps[last], at, end), recording.ErrCorrupt)
	})
	t.Run("LastTwoPartsDeleted", func(t *testing.T) {
		ps := copyParts(t, paths, func(i int, b []byte) []byte {
			if i >= last-1 {
				return nil
			}
			return b
		})
		gone := filepath.Join(filepath.Dir(ps[0]), filepath.Base(paths[last-1]))
		scan(t, []string{filepath.Dir(ps[0])}, fmt.Sprintf("recordings do not make one replay: %s: offset %d names the part that follows it, %s, "+
			"which is missing: the run's later parts are gone", ps[last-2], tails[last-2].EndOffset, gone), recording.ErrBadSet)
	})
	t.Run("MiddlePartDeleted", func(t *testing.T) {
		ps := copyParts(t, paths, func(i int, b []byte) []byte {
			if i == 1 {
				return nil
			}
			return b
		})
		gone := filepath.Join(filepath.Dir(ps[0]), filepath.Base(paths[1]))
		scan(t, ps, fmt.Sprintf("recordings do not make one replay: %s: offset %d names the part that follows it, %s, "+
			"which is missing: the run's later parts are gone", ps[0], tails[0].EndOffset, gone), recording.ErrBadSet)
	})
	t.Run("PartLeftOut", func(t *testing.T) {
		ps := slices.Delete(slices.Clone(paths), 1, 2)
		scan(t, ps, fmt.Sprintf("recordings do not make one replay: %s: offset %d names the part that follows it, %s, "+
			"which is not among the recordings given", ps[0], tails[0].EndOffset, paths[1]), recording.ErrBadSet)
	})
}

// frameBody is where a frame's body starts after its offset: sync,
// length and checksum.
const frameBody = 2 + 4 + 4
