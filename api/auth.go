package api

import (
	"net/http"
)

// adminOnly lets through requests carrying an admin token (see
// requireToken: 403 with none configured or with a read token, 401 with a
// missing or wrong one).
func (s *Server) adminOnly(next http.Handler) http.Handler {
	tokened := s.requireToken(RoleAdmin)
	return tokened(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if why := s.starting(); why != "" {
			// The database is not this server's yet: another may own it.
			writeError(w, http.StatusServiceUnavailable, CodeStarting, "the server is starting: "+why)
			return
		}
		next.ServeHTTP(w, r)
	}))
}

// readToken lets through requests carrying any configured token, read or
// admin: what may hold personal data (dead letters' payloads) is served
// to a token only.
func (s *Server) readToken(next http.Handler) http.Handler {
	return s.requireToken(RoleRead)(next)
}
