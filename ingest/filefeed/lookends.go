package filefeed

// LookEnds looks at the current file's size, without reading it, and
// makes it the feed's end when the file grew past the end last published
// (ingest.EndLooker): while the loop reads nothing (it waits at the
// outbox backlog's bound), the end and the lag follow the file. A file
// that shrank, or was replaced, is left to the next read, which tells a
// truncation from a rotation; the feed's own state is not touched.
func (f *Feed) LookEnds() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || f.cur == nil || f.cur.epoch == "" {
		return
	}
	fi, err := f.cur.file.Stat()
	if err != nil || fi.Size() <= f.end.Load() {
		return
	}
	f.end.Store(fi.Size())
}
