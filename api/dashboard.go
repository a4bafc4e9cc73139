package api

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// dashboardFiles is the dashboard: plain HTML, CSS and JS, no build step.
//
//go:embed dashboard
var dashboardFiles embed.FS

// dashboardFS is dashboardFiles rooted at its directory.
var dashboardFS, _ = fs.Sub(dashboardFiles, "dashboard")

// dashboardCSP allows the page only its own scripts, styles and API.
const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func dashboardHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
}

// handleDashboard serves GET /: the dashboard page. It reads the JSON
// endpoints itself, every second.
func (s *Server) handleDashboard(w http.ResponseWriter, r *http.Request) {
	dashboardHeaders(w)
	http.ServeFileFS(w, r, dashboardFS, "index.html")
}

// handleDashboardAsset serves the dashboard's script and style sheet under
// /dashboard/.
func (s *Server) handleDashboardAsset(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/") {
		writeError(w, http.StatusNotFound, CodeNotFound, "no such file: "+r.URL.Path)
		return
	}
	dashboardHeaders(w)
	http.StripPrefix("/dashboard/", http.FileServerFS(dashboardFS)).ServeHTTP(w, r)
}
