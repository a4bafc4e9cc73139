package server

import (
	"flag"
	"log/slog"
	"sort"
	"strings"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/internal/kafkasec"
)

// envPrefix starts every environment variable outboxd reads.
const envPrefix = "OUTBOXD_"

// UnknownEnv is a variable of the environment that starts with OUTBOXD_
// but names no setting, with the known variable closest to it.
type UnknownEnv struct {
	Name, Closest string // Closest is empty when CommandLineOnly
	// CommandLineOnly is set when Name would be a flag's variable, but the
	// flag is read from the command line only.
	CommandLineOnly bool
}

// UnknownEnvs returns the OUTBOXD_ variables of environ (KEY=VALUE
// entries) that outboxd does not read, sorted, each with the closest known
// name by edit distance.
func UnknownEnvs(environ []string) []UnknownEnv {
	known, onlyFlags := knownEnvs()
	var out []UnknownEnv
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || known[name] {
			continue
		}
		u := UnknownEnv{Name: name, CommandLineOnly: onlyFlags[name]}
		if !u.CommandLineOnly {
			u.Closest = closest(name, known)
		}
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// warnUnknownEnv logs one warning per unknown OUTBOXD_ variable: a typo
// there would otherwise leave a setting at its default without a word.
func warnUnknownEnv(logger *slog.Logger, environ []string) {
	for _, u := range UnknownEnvs(environ) {
		if u.CommandLineOnly {
			logger.Warn("environment variable ignored: its flag is read from the command line only", "name", u.Name)
			continue
		}
		logger.Warn("unknown environment variable ignored", "name", u.Name, "closest", u.Closest)
	}
}

// knownEnvs returns the variables outboxd reads, and those that would be
// flags' but are not read (command-line-only flags).
func knownEnvs() (known, onlyFlags map[string]bool) {
	known = map[string]bool{
		"OUTBOXD_CONFIG": true, api.EnvAdminToken: true, kafkasec.EnvPassword: true, EnvToken: true,
	}
	for _, e := range seamEnvs {
		known[e] = true
	}
	onlyFlags = map[string]bool{}
	c := DefaultConfig()
	var p string
	flagSet(&c, &p, &givenSettings{}).VisitAll(func(f *flag.Flag) {
		if cmdlineOnly[f.Name] {
			onlyFlags[envName(f.Name)] = true
			return
		}
		known[envName(f.Name)] = true
	})
	return known, onlyFlags
}

// closest returns the name in known nearest to name by edit distance
// (the alphabetically first of equals).
func closest(name string, known map[string]bool) string {
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, k)
	}
	sort.Strings(names)
	best, bestD := "", -1
	for _, k := range names {
		if d := editDistance(name, k); bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
