package server

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain_WarnSharedDir: a file feed whose file lives in the database's
// directory (however the paths are spelled) is warned about once; one in
// another directory is not.
func TestMain_WarnSharedDir(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		file string
		warn bool
	}{
		{filepath.Join(dir, "app.log"), true},
		{filepath.Join(dir, "sub", "..", "app.log"), true},
		{filepath.Join(dir, "logs", "app.log"), false},
		{filepath.Join(t.TempDir(), "app.log"), false},
	} {
		var logged bytes.Buffer
		m := &Main{Config: Config{DB: filepath.Join(dir, "outboxd.db")}, Logger: slog.New(slog.NewTextHandler(&logged, nil))}
		m.warnSharedDir("pay", tc.file)
		if got := strings.Count(logged.String(), "in the database's directory"); got != map[bool]int{true: 1, false: 0}[tc.warn] {
			t.Errorf("%s: %d warnings, want warn=%v; log: %s", tc.file, got, tc.warn, logged.String())
		}
	}
}
