package api

import "github.com/outboxd/outboxd/internal/relaystatus"

// The relay's states and modes, as the API reports them: the shared
// vocabulary (internal/relaystatus), as strings to compare with a
// RelayStatus's fields. Metrics have one outboxd_relay_state series per
// state.
const (
	RelayStateStarting     = string(relaystatus.StateStarting)
	RelayStatePublishing   = string(relaystatus.StatePublishing)
	RelayStateIdle         = string(relaystatus.StateIdle)
	RelayStateBackingOff   = string(relaystatus.StateBackingOff)
	RelayStateUnauthorized = string(relaystatus.StateUnauthorized) // /readyz fails
	RelayStateRefusing     = string(relaystatus.StateRefusing)
	RelayStateFenced       = string(relaystatus.StateFenced)
	RelayStateStopped      = string(relaystatus.StateStopped)
	// RelayStateOff and RelayModeNone are reported when no relay runs.
	RelayStateOff = string(relaystatus.StateOff)
	RelayModeNone = string(relaystatus.ModeNone)
)

// RelayStates lists every state the relay reports (RelayStateOff when it
// is off), in the order the metrics report them.
var RelayStates = func() []string {
	out := make([]string, len(relaystatus.States))
	for i, st := range relaystatus.States {
		out[i] = string(st)
	}
	return out
}()
