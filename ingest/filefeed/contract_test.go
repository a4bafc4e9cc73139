package filefeed_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/feedtest"
	"github.com/outboxd/outboxd/ingest/filefeed"
)

func TestFeed_Contract(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.log")
	rotations := 0
	feedtest.Run(t, feedtest.Harness{
		Name: "file",
		New: func(t *testing.T) ingest.Feed {
			return filefeed.New(path, filefeed.Options{
				PollInterval: 20 * time.Millisecond,
				Logger:       slog.New(slog.NewTextHandler(t.Output(), nil)),
			})
		},
		Append: func(t *testing.T, values ...[]byte) {
			t.Helper()
			f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var lines []byte
			for _, v := range values {
				lines = append(append(lines, v...), '\n')
			}
			if _, err := f.Write(lines); err != nil {
				t.Fatal(err)
			}
		},
		Replace: func(t *testing.T) {
			t.Helper()
			rotations++
			if err := os.Rename(path, fmt.Sprintf("%s.%d", path, rotations)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		},
	})
}
