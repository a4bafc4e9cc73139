package kafkafeed

// Unconfirmed returns how many records of feed partition p wait for a
// metadata request to confirm them: a test waits on it to know a record was
// read before it re-creates the topic.
func Unconfirmed(f *Feed, p int32) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.slots[p]
	if !ok {
		return 0
	}
	n := 0
	for _, e := range s.pending {
		if !e.verified && !e.at.Before(f.verified[s.topic]) {
			n++
		}
	}
	return n
}
