package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// adminOnly lets through requests carrying the admin token as a bearer
// token. With no token configured it answers 403 and says how to enable
// the endpoint; with a missing or wrong token, 401.
func (s *Server) adminOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.tokenHash == nil {
			writeError(w, http.StatusForbidden, CodeAdminDisabled,
				"admin endpoints are disabled: start the server with --admin-token-file FILE or "+
					EnvAdminToken+" set, then send Authorization: Bearer <token>")
			return
		}
		if !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxd"`)
			writeError(w, http.StatusUnauthorized, CodeUnauthorized, "a valid Authorization: Bearer <token> header is required")
			return
		}
		if why := s.starting(); why != "" {
			// The database is not this server's yet: another may own it.
			writeError(w, http.StatusServiceUnavailable, CodeStarting, "the server is starting: "+why)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authorized compares the request's bearer token with the admin token in
// constant time. Both are hashed first, so neither the content nor the
// length of the token leaks through timing.
func (s *Server) authorized(r *http.Request) bool {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(h[:], s.tokenHash) == 1
}
