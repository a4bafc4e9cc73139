package api

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/go-chi/chi/v5/middleware"
)

// recoverer turns a panic in a handler into a JSON 500. The panic and its
// stack go to the log, never to the client.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p == http.ErrAbortHandler {
				panic(p) // the server's own way to abort a response: let it through
			}
			s.log.Error("handler panicked", logKeyMethod, r.Method, logKeyPath, r.URL.Path,
				logKeyPanic, fmt.Sprint(p), logKeyStack, string(debug.Stack()))
			writeError(w, http.StatusInternalServerError, CodeInternal, "internal error; see the server log")
		}()
		next.ServeHTTP(w, r)
	})
}

// logRequests logs each request at debug level.
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		start := time.Now()
		next.ServeHTTP(ww, r)
		s.log.Debug("request", logKeyMethod, r.Method, logKeyPath, r.URL.Path, logKeyStatus, ww.Status(),
			logKeyDur, time.Since(start))
	})
}

// limitBody reads the request body, up to the cap, before the handler
// runs: a body over the cap is answered 413 whatever the endpoint. The
// API's bodies are small or empty, so holding one in memory costs little.
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > s.cfg.MaxBody {
			s.tooLarge(w)
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
			var mbe *http.MaxBytesError
			switch {
			case errors.As(err, &mbe):
				s.tooLarge(w)
				return
			case err != nil:
				writeError(w, http.StatusBadRequest, CodeBadRequest, "reading the request body: "+err.Error())
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) tooLarge(w http.ResponseWriter) {
	// The rest of the body is not read: close the connection rather than
	// drain it.
	w.Header().Set("Connection", "close")
	writeError(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
		fmt.Sprintf("the request body is over the limit of %d bytes", s.cfg.MaxBody))
}
