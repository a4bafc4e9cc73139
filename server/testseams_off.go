//go:build !testseams

package server

// seamEnvs is empty: a binary built without the testseams tag has no test
// seam (see testseams_on.go).
var seamEnvs []string

// installTestSeams does nothing without the testseams tag.
func (m *Main) installTestSeams() error { return nil }
