// Package testseam holds what tests use to break outboxd's guarantees on
// purpose, to show that they matter: a feed that re-delivers items the
// store already has (Rewound), which the replay guard skips, and a stored
// position moved back (MoveBack), after which re-delivered items are
// applied again. The ingest loop knows nothing of it: the guard is always
// on. The server reaches it only in a binary built with the `testseams`
// tag (server/testseams_on.go), so the shipped binary holds none of it.
package testseam

import (
	"context"
	"fmt"
	"maps"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Rewound returns f opening at the positions of at (keyed by partition)
// where they are before the checkpoint the loop asks for, in the
// checkpoint's epoch: the feed re-delivers items the store already has.
// The other partitions open where asked. It keeps f's optional interfaces
// (ingest.ItemSizer, ingest.Waiter, ingest.Troubler, ingest.EndLooker):
// where f has none, it answers as a feed without it would be taken.
func Rewound(f ingest.Feed, at map[int32]int64) ingest.Feed {
	return &rewound{Feed: f, at: at}
}

type rewound struct {
	ingest.Feed
	at map[int32]int64
}

// Open opens the feed at the rewound positions.
func (r *rewound) Open(ctx context.Context, from map[int32]outbox.Checkpoint) error {
	from = maps.Clone(from)
	for p, c := range from {
		if pos, ok := r.at[p]; ok && pos < c.Position {
			c.Position = pos
			from[p] = c
		}
	}
	return r.Feed.Open(ctx, from)
}

// MaxItemBytes is f's, or 0 (the loop's default).
func (r *rewound) MaxItemBytes() int {
	if s, ok := r.Feed.(ingest.ItemSizer); ok {
		return s.MaxItemBytes()
	}
	return 0
}

// Waiting is f's, or "" (never waiting).
func (r *rewound) Waiting() string {
	if w, ok := r.Feed.(ingest.Waiter); ok {
		return w.Waiting()
	}
	return ""
}

// Trouble is f's, or none.
func (r *rewound) Trouble() (string, bool) {
	if t, ok := r.Feed.(ingest.Troubler); ok {
		return t.Trouble()
	}
	return "", false
}

// LookEnds is f's, or nothing.
func (r *rewound) LookEnds() {
	if el, ok := r.Feed.(ingest.EndLooker); ok {
		el.LookEnds()
	}
}

// MoveBack stores partition's position of feed as pos, in its stored epoch;
// the stored one must be past it. A loop started next resumes at pos, and
// applies the items after it again. The store must not be serving a loop
// of feed meanwhile.
func MoveBack(ctx context.Context, s *outbox.Store, feed string, partition int32, pos int64) error {
	cps, err := s.Positions(ctx, feed)
	if err != nil {
		return fmt.Errorf("move back %s[%d]: %w", feed, partition, err)
	}
	c, ok := cps[partition]
	if !ok || c.Position <= pos {
		return fmt.Errorf("move back %s[%d] to %d: the stored position is %d (stored: %v)", feed, partition, pos, c.Position, ok)
	}
	c.Position = pos
	tx, err := s.Begin(ctx)
	if err != nil {
		return fmt.Errorf("move back %s[%d]: %w", feed, partition, err)
	}
	defer tx.Rollback()
	if err := tx.SetPosition(ctx, feed, c); err != nil {
		return fmt.Errorf("move back %s[%d]: %w", feed, partition, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("move back %s[%d]: %w", feed, partition, err)
	}
	return nil
}
