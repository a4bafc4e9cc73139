package server

import (
	"math"
	"runtime/debug"
	"testing"
)

func TestTuneMemory(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	for _, c := range []struct {
		env   string // "" leaves GOMEMLIMIT out
		feeds int
		want  int64 // the limit in effect after; 0: left as it was
	}{
		{feeds: 0, want: 128 << 20},
		{feeds: 1, want: 128 << 20},
		{feeds: 3, want: 256 << 20},
		{env: "1GiB", feeds: 1},
		{env: "off", feeds: 1},
	} {
		debug.SetMemoryLimit(math.MaxInt64)
		t.Setenv("GOMEMLIMIT", c.env)
		got := TuneMemory(c.feeds)
		now := debug.SetMemoryLimit(-1)
		if c.want == 0 {
			if got != 0 || now != math.MaxInt64 {
				t.Errorf("GOMEMLIMIT=%s: TuneMemory returned %d and the limit is %d, want 0 and unchanged", c.env, got, now)
			}
			continue
		}
		if got != c.want || now != c.want {
			t.Errorf("%d feeds: TuneMemory returned %d and the limit is %d, want %d", c.feeds, got, now, c.want)
		}
	}
}
