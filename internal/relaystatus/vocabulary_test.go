package relaystatus_test

import (
	"testing"

	"github.com/outboxd/outboxd/internal/relaystatus"
	"github.com/outboxd/outboxd/relay"
)

// TestVocabulary_SameAsRelay: the words the API reports are the relay's,
// every one of them.
func TestVocabulary_SameAsRelay(t *testing.T) {
	for _, c := range []struct {
		relay  relay.State
		shared relaystatus.State
	}{
		{relay.StateStarting, relaystatus.StateStarting},
		{relay.StatePublishing, relaystatus.StatePublishing},
		{relay.StateIdle, relaystatus.StateIdle},
		{relay.StateBackingOff, relaystatus.StateBackingOff},
		{relay.StateUnauthorized, relaystatus.StateUnauthorized},
		{relay.StateRefusing, relaystatus.StateRefusing},
		{relay.StateFenced, relaystatus.StateFenced},
		{relay.StateStopped, relaystatus.StateStopped},
	} {
		if c.relay != c.shared {
			t.Errorf("relay state %q, shared %q", c.relay, c.shared)
		}
	}
	if relay.ModeExactlyOnce != relaystatus.ModeExactlyOnce || relay.ModeAtLeastOnce != relaystatus.ModeAtLeastOnce {
		t.Errorf("relay modes %q, %q; shared %q, %q", relay.ModeExactlyOnce, relay.ModeAtLeastOnce,
			relaystatus.ModeExactlyOnce, relaystatus.ModeAtLeastOnce)
	}
	seen := map[relaystatus.State]bool{}
	for _, st := range relaystatus.States {
		if seen[st] {
			t.Errorf("%q twice in States", st)
		}
		seen[st] = true
	}
	if len(seen) != 9 || relaystatus.States[len(relaystatus.States)-1] != relaystatus.StateOff {
		t.Errorf("States %q: want the 8 relay states, then off", relaystatus.States)
	}
}
