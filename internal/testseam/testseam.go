// Package testseam holds the switches through which tests break outboxd's
// guarantees on purpose, to show that they matter: an ingest loop that
// rewinds a feed or applies re-delivered items again. Being internal, it is
// out of reach of the library's users; the server sets it only in a binary
// built with the `testseams` tag (server/testseams_on.go), so the shipped
// binary cannot switch the replay guard off. Safe for concurrent use.
package testseam

import "sync"

// Ingest is what a test asks of one feed's ingest loop.
type Ingest struct {
	// DisableGuard applies re-delivered items again.
	DisableGuard bool
	// Rewind opens these partitions at an earlier position of their
	// stored epoch, so the feed re-delivers items the store already has.
	Rewind map[int32]int64
}

var (
	mu     sync.Mutex
	ingest = map[string]Ingest{}
)

// SetIngest makes the loops of feed started from now on behave as s says.
// It returns a function that removes the setting.
func SetIngest(feed string, s Ingest) (reset func()) {
	mu.Lock()
	ingest[feed] = s
	mu.Unlock()
	return func() {
		mu.Lock()
		delete(ingest, feed)
		mu.Unlock()
	}
}

// IngestFor is the setting of feed (the zero Ingest when none).
func IngestFor(feed string) Ingest {
	mu.Lock()
	defer mu.Unlock()
	return ingest[feed]
}
