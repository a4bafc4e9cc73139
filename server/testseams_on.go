//go:build testseams

package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/testseam"
	"github.com/outboxd/outboxd/outbox"
)

// Test seams: environment variables that end-to-end tests use to reach into
// a running binary. They break guarantees on purpose and are logged loudly.
// They exist only in a binary built with the testseams tag, as tests/ builds
// one for the tests that need them; the shipped binary has none. (A test
// that wants re-delivered items applied again moves the stored position
// back before the start: see testseam.MoveBack.)
const (
	// envRewind=NAME=POS[,NAME=POS] opens feed NAME's partition 0 at POS of
	// its stored epoch, so stored items are re-delivered (and skipped by
	// the replay guard).
	envRewind = "OUTBOXD_TEST_REWIND"
	// envFailCommits=PATH: when the file PATH appears holding a number N,
	// the next N store commits fail, then the file is removed.
	envFailCommits = "OUTBOXD_TEST_FAIL_COMMITS"
)

// seamEnvs are the seams' variables, known to the check of OUTBOXD_*
// variables.
var seamEnvs = []string{envRewind, envFailCommits}

// installTestSeams reads the seams from the environment and installs them:
// the feeds' rewinds (see seamFeed) and the store's commit hook.
func (m *Main) installTestSeams() error {
	s, err := loadTestSeams(m.Logger)
	if err != nil {
		return err
	}
	s.installCommitHook(m.Store)
	m.seams = s
	return nil
}

// seamFeed is feed, opened at the rewind the environment asks for feed
// name, if any (see testseam.Rewound).
func (m *Main) seamFeed(name string, feed ingest.Feed) ingest.Feed {
	at := m.seams.rewind[name]
	if at == nil {
		return feed
	}
	m.Logger.Warn("rewinding feed (test seam): stored items will be re-delivered", "feed", name, "from", at)
	return testseam.Rewound(feed, at)
}

type testSeams struct {
	rewind   map[string]map[int32]int64
	failFile string
}

func loadTestSeams(log *slog.Logger) (testSeams, error) {
	var s testSeams
	if v := os.Getenv(envRewind); v != "" {
		s.rewind = map[string]map[int32]int64{}
		for _, kv := range strings.Split(v, ",") {
			name, pos, ok := strings.Cut(kv, "=")
			n, err := strconv.ParseInt(pos, 10, 64)
			if !ok || err != nil {
				return s, fmt.Errorf("%s: %q: want NAME=POSITION", envRewind, kv)
			}
			s.rewind[name] = map[int32]int64{0: n}
		}
	}
	s.failFile = os.Getenv(envFailCommits)
	if s.rewind != nil || s.failFile != "" {
		log.Warn("TEST SEAMS ENABLED: exactly-once is not guaranteed",
			"rewind", s.rewind, "failCommits", s.failFile)
	}
	return s, nil
}

var errInjected = errors.New("injected commit failure (test seam)")

// installCommitHook makes commits fail as the fail file says. The hook runs
// under the store's single writer, so it needs no lock of its own.
func (s testSeams) installCommitHook(st *outbox.Store) {
	if s.failFile == "" {
		return
	}
	path, left := s.failFile, 0
	st.SetCommitHook(func(context.Context) error {
		if left == 0 {
			b, err := os.ReadFile(path)
			if err != nil {
				return nil
			}
			n, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || n < 1 {
				return nil
			}
			left = n
			os.Remove(path)
		}
		left--
		return errInjected
	})
}
