package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
)

// Roles of a token. An admin token may do everything a token may; a read
// token reads what needs a token to read (dead letters, whose payloads
// may hold personal data) and changes nothing.
const (
	RoleAdmin = "admin"
	RoleRead  = "read"
)

// AdminTokenName is the name of the token of --admin-token-file (or
// OUTBOXD_ADMIN_TOKEN): an admin token.
const AdminTokenName = "admin"

// Error codes of the token checks, beside those of respond.go.
const (
	// CodeForbidden: the token is valid but its role does not allow the
	// request (a read token asking to change something).
	CodeForbidden = "forbidden"
	// CodeTokensDisabled: no token is configured, so nothing that needs
	// one is served.
	CodeTokensDisabled = "tokens_disabled"
)

// Token is one named bearer token of the API. The name is what the API
// records as who did an action (a dead letter discarded, losses
// acknowledged) and logs; the secret is never logged.
type Token struct {
	Name   string
	Role   string
	Secret string
}

var tokenName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ParseToken reads one token spec: NAME=SECRET (an admin token),
// NAME:ROLE=SECRET (ROLE admin or read), and SECRET may be @FILE, the
// secret being FILE's content with surrounding white space trimmed, read
// through readFile. The secret is checked as Config.Validate checks it.
func ParseToken(spec string, readFile func(string) ([]byte, error)) (Token, error) {
	head, secret, ok := strings.Cut(spec, "=")
	if !ok {
		return Token{}, errors.New("want NAME=SECRET, NAME:read=SECRET or NAME=@FILE")
	}
	name, role, hasRole := strings.Cut(head, ":")
	if !hasRole {
		role = RoleAdmin
	}
	if !tokenName.MatchString(name) {
		return Token{}, fmt.Errorf("token name %q: want 1 to 64 letters, digits, '.', '_' or '-'", name)
	}
	if role != RoleAdmin && role != RoleRead {
		return Token{}, fmt.Errorf("token %s: role %q: want admin or read", name, role)
	}
	if path, ok := strings.CutPrefix(secret, "@"); ok {
		b, err := readFile(path)
		if err != nil {
			return Token{}, fmt.Errorf("token %s: %w", name, err)
		}
		secret = strings.TrimSpace(string(b))
	}
	if err := checkToken(secret); err != nil {
		return Token{}, fmt.Errorf("token %s: %w", name, err)
	}
	return Token{Name: name, Role: role, Secret: secret}, nil
}

// ParseTokens reads specs (see ParseToken) beside the admin token (its
// name AdminTokenName; "" when none). Names and secrets must be unique:
// each action is recorded under one name.
func ParseTokens(admin string, specs []string, readFile func(string) ([]byte, error)) ([]Token, error) {
	var out []Token
	if admin != "" {
		out = append(out, Token{Name: AdminTokenName, Role: RoleAdmin, Secret: admin})
	}
	for _, spec := range specs {
		tok, err := ParseToken(spec, readFile)
		if err != nil {
			return nil, fmt.Errorf("--api-token: %w", err)
		}
		for _, o := range out {
			switch {
			case o.Name == tok.Name && o.Name == AdminTokenName && admin != "":
				return nil, fmt.Errorf("--api-token: token %s: the token of --admin-token-file (or %s) has that name", tok.Name, EnvAdminToken)
			case o.Name == tok.Name:
				return nil, fmt.Errorf("--api-token: token %s given twice", tok.Name)
			case o.Secret == tok.Secret:
				return nil, fmt.Errorf("--api-token: tokens %s and %s have the same secret", o.Name, tok.Name)
			}
		}
		out = append(out, tok)
	}
	return out, nil
}

// tokenEntry is a token as the server keeps it: the secret hashed.
type tokenEntry struct {
	name, role string
	hash       [sha256.Size]byte
}

// newTokenEntries hashes the configured tokens: the admin token of
// cfg.AdminToken, then cfg.Tokens.
func newTokenEntries(cfg Config) []tokenEntry {
	toks := cfg.Tokens
	if cfg.AdminToken != "" {
		toks = append([]Token{{Name: AdminTokenName, Role: RoleAdmin, Secret: cfg.AdminToken}}, toks...)
	}
	out := make([]tokenEntry, 0, len(toks))
	for _, t := range toks {
		out = append(out, tokenEntry{name: t.Name, role: t.Role, hash: sha256.Sum256([]byte(t.Secret))})
	}
	return out
}

// bearer finds the request's bearer token among the configured ones. Every
// entry is compared, in constant time, over hashes: neither the content
// nor the length of a token, nor which one matched, leaks through timing.
func (s *Server) bearer(r *http.Request) (tokenEntry, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return tokenEntry{}, false
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	found, match := -1, 0
	for i, e := range s.tokens {
		eq := subtle.ConstantTimeCompare(h[:], e.hash[:])
		found = subtle.ConstantTimeSelect(eq&(1-match), i, found)
		match |= eq
	}
	if match == 0 {
		return tokenEntry{}, false
	}
	return s.tokens[found], true
}

// hasToken reports whether a token that may do what role may is
// configured.
func (s *Server) hasToken(role string) bool {
	for _, e := range s.tokens {
		if role == RoleRead || e.role == RoleAdmin {
			return true
		}
	}
	return false
}

// callerKey is the context key of the name of the token a request carried.
type callerKey struct{}

// caller is the name of the token the request carried ("" when none was
// asked for).
func caller(r *http.Request) string {
	name, _ := r.Context().Value(callerKey{}).(string)
	return name
}

// requireToken lets through requests carrying a configured token of the
// role (an admin token does for a read), the token's name in the request's
// context (see caller). With no token configured it answers 403 and says
// how to configure one; with a missing or wrong token 401; with a read
// token where admin is needed 403.
func (s *Server) requireToken(role string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !s.hasToken(role) {
				code, what := CodeTokensDisabled, "reading dead letters needs a token, and none is configured"
				if role == RoleAdmin {
					code, what = CodeAdminDisabled, "admin endpoints are disabled: no admin token is configured"
				}
				writeError(w, http.StatusForbidden, code, what+": start the server with --api-token NAME=SECRET "+
					"(or NAME:read=SECRET for reading only; SECRET may be @FILE), --admin-token-file FILE or "+
					EnvAdminToken+" set, then send Authorization: Bearer <secret>")
				return
			}
			tok, ok := s.bearer(r)
			if !ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="outboxd"`)
				writeError(w, http.StatusUnauthorized, CodeUnauthorized, "a valid Authorization: Bearer <token> header is required")
				return
			}
			if role == RoleAdmin && tok.role != RoleAdmin {
				writeError(w, http.StatusForbidden, CodeForbidden, fmt.Sprintf("token %s may only read: this needs an admin token", tok.name))
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, tok.name)))
		})
	}
}
