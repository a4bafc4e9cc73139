//go:build !testseams

package server

import "github.com/outboxd/outboxd/ingest"

// seamEnvs is empty: a binary built without the testseams tag has no test
// seam (see testseams_on.go).
var seamEnvs []string

// installTestSeams does nothing without the testseams tag.
func (m *Main) installTestSeams() error { return nil }

// testSeams is empty without the testseams tag.
type testSeams struct{}

// seamFeed is feed itself without the testseams tag.
func (m *Main) seamFeed(_ string, feed ingest.Feed) ingest.Feed { return feed }
