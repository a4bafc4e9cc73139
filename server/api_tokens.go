package server

import (
	"flag"
	"os"

	"github.com/outboxd/outboxd/api"
)

// APITokenConfig names the bearer tokens of the HTTP API beside the one
// of --admin-token-file (named admin): who an action is recorded under,
// and whether the token may change anything or only read dead letters.
type APITokenConfig struct {
	// Specs are NAME=SECRET, NAME:read=SECRET, with @FILE for a secret
	// read from FILE (see api.ParseToken).
	Specs []string `yaml:"apiToken"`
	// Tokens are the tokens once resolved, the admin token first.
	Tokens []api.Token `yaml:"-"`
}

func (a *APITokenConfig) flags(fs *flag.FlagSet) {
	fs.Var(list{&a.Specs}, "api-token", "named bearer tokens of the HTTP API, a comma-separated `LIST` of NAME=SECRET "+
		"(admin: every endpoint) or NAME:read=SECRET (reads dead letters only); SECRET may be @FILE, read from FILE; "+
		"the name is recorded as who discarded, requeued or acknowledged")
}

// resolve reads the tokens' files and checks them beside the admin
// token. Only the named ones are kept in Tokens (api.Config takes the
// admin token apart).
func (a *APITokenConfig) resolve(admin string) error {
	toks, err := api.ParseTokens(admin, a.Specs, os.ReadFile)
	if err != nil {
		return err
	}
	if admin != "" {
		toks = toks[1:]
	}
	a.Tokens = toks
	return nil
}
