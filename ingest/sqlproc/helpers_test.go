package sqlproc_test

import (
	"bytes"
	"os"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/ingest/sqlproc"
)

// loadConfig reads a processor's configuration as the configuration file
// holds it, refusing unknown keys.
func loadConfig(tb testing.TB, name, path string) sqlproc.Config {
	tb.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	var c sqlproc.Config
	if err := dec.Decode(&c); err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	c.Name = name
	return c
}
