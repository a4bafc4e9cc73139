package kafkafeed

import (
	"sort"
	"sync"
	"time"

	"github.com/outboxd/outboxd/internal/kafkasec"
)

// DefaultRefusedRetry is Config.RefusedRetry unless set.
const DefaultRefusedRetry = 10 * time.Second

// Where a refusal came from, as troubles keys them. A refusal of the
// connection, of the topics' metadata or of fetching keeps the feed from
// reading; one of the group's offsets does not (they are for Kafka's
// tools only).
const (
	troubleConnect  = "connect"
	troubleMetadata = "metadata"
	troubleFetch    = "fetch:" // + topic
	troubleGroup    = "group"
)

// troubles holds the refusals the feed meets now, by where they came
// from: what Trouble reports and what is logged once. Safe for concurrent
// use.
type troubles struct {
	mu  sync.Mutex
	now map[string]string // where -> message
}

// set records err as the refusal at where when kafkasec.Refused(err), and
// clears where otherwise. It reports whether the message there is new
// (to be logged) and whether err is a refusal.
func (t *troubles) set(where string, err error) (changed, refused bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.now[where]
	if err == nil || !kafkasec.Refused(err) {
		delete(t.now, where)
		return false, false
	}
	if t.now == nil {
		t.now = map[string]string{}
	}
	t.now[where] = err.Error()
	return prev != err.Error(), true
}

// clear forgets the refusal at where; it reports whether there was one.
func (t *troubles) clear(where string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.now[where]
	delete(t.now, where)
	return ok
}

// first returns a refusal that keeps the feed from reading, or else the
// group's, "" for none; stalls says which.
func (t *troubles) first() (msg string, stalls bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.now))
	for k := range t.now {
		if k != troubleGroup {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(keys) > 0 {
		return t.now[keys[0]], true
	}
	return t.now[troubleGroup], false
}

// Trouble returns the refusal Kafka gives the feed now ("" for none):
// of its credentials, or of an operation its ACLs do not grant, naming
// the operation and the resource. stalls says it keeps the feed from
// reading (the connection, the topics, fetching); a refusal of the
// group's offsets does not. Safe for concurrent use.
func (f *Feed) Trouble() (msg string, stalls bool) { return f.troubles.first() }
