package server

import (
	"runtime/debug"
	"strings"
)

// Version describes the running binary from its build information: the
// module version ("(devel)" for a build from a checkout), the VCS revision
// and time, "+dirty" for uncommitted changes, and the Go version.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "outboxd (no build information)"
	}
	parts := []string{"outboxd", bi.Main.Version}
	var rev, at, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev != "" {
		parts = append(parts, "revision "+rev+dirty)
	}
	if at != "" {
		parts = append(parts, at)
	}
	parts = append(parts, bi.GoVersion)
	return strings.Join(parts, " ")
}
