package api

// The relay's states (relay.State*), as the API reports them: metrics have
// one outboxd_relay_state series per state.
const (
	RelayStateStarting   = "starting"
	RelayStatePublishing = "publishing"
	RelayStateIdle       = "idle"
	RelayStateBackingOff = "backing-off"
	RelayStateRefusing   = "refusing"
	RelayStateFenced     = "fenced"
	RelayStateStopped    = "stopped"
)

// RelayStates lists every state the relay reports (RelayStateOff when it
// is off), in the order the metrics report them.
var RelayStates = []string{RelayStateStarting, RelayStatePublishing, RelayStateIdle, RelayStateBackingOff,
	RelayStateUnauthorized, RelayStateRefusing, RelayStateFenced, RelayStateStopped, RelayStateOff}
