package filefeed

// advance moves the feed on when the current file has no complete line
// ready: it opens the file once one exists, announces its epoch once it has a
// fingerprint, and, before reading on past an end found earlier, looks for
// growth, truncation and rotation. It reports whether anything changed, so
// that reading may go on.
func (f *Feed) advance() (bool, error) {
	switch {
	case f.cur == nil:
		err := f.openPath()
		return f.cur != nil, err
	case f.cur.epoch == "":
		return f.announceCurrent()
	}
	size, err := f.cur.stat()
	if err != nil {
		return false, err
	}
	truncated, err := f.truncated(size)
	switch {
	case err != nil:
		return false, err
	case truncated:
		return true, f.restart(size)
	}
	f.cur.saw(size)
	if size > f.cur.split.fed() {
		f.cur.atEOF = false
		return true, nil
	}
	return f.rotate()
}

// announceCurrent announces the current file's epoch once the file has a
// fingerprint. A file replaced at the path before it had one is dropped for
// the new one: nothing of it was delivered, and without an epoch nothing of it
// can be reported lost.
func (f *Feed) announceCurrent() (bool, error) {
	next, err := f.upcoming()
	if err != nil {
		return false, err
	}
	if next != nil {
		old := f.cur
		f.cur, f.next = nil, nil
		f.use(next)
		f.log.Info("file replaced before its first line")
		return true, old.close()
	}
	fp, ok, err := f.cur.fingerprint()
	if err != nil || !ok {
		return false, err
	}
	f.cur.id.fp = fp
	f.announce(f.cur)
	return true, nil
}

// truncated reports whether the current file started over in place: it is
// shorter than what was read of it, or its first line changed (truncated and
// written again between two looks).
func (f *Feed) truncated(size int64) (bool, error) {
	if size < f.cur.split.fed() {
		return true, nil
	}
	fp, ok, err := f.cur.fingerprint()
	if err != nil {
		return false, err
	}
	return !ok || fp != f.cur.id.fp, nil
}

// restart reads the current file, truncated in place, from 0 under a new
// epoch (announced once it has a first line), after a RecordLoss for the bytes
// seen in it and never read.
func (f *Feed) restart(size int64) error {
	c := f.cur
	if c.unread() {
		f.lose(c.epoch, c.split.pos, c.seen, LossTruncated)
	}
	f.log.Info("file truncated", logEpoch, c.epoch, logFrom, c.split.pos, "size", size)
	c.epoch, c.id.fp, c.seen = "", "", size
	return c.seek(0)
}

// rotate switches to the file now at the path once it has a fingerprint. The
// caller has read the current file to its end: what was seen past its last
// complete line is reported lost. It reports whether it switched.
func (f *Feed) rotate() (bool, error) {
	next, err := f.upcoming()
	if err != nil || next == nil {
		return false, err
	}
	if next.id.fp == "" {
		fp, ok, err := next.fingerprint()
		if err != nil || !ok {
			return false, err
		}
		next.id.fp = fp
	}
	old := f.cur
	if old.unread() {
		f.lose(old.epoch, old.split.pos, old.seen, LossUnterminated)
	}
	f.log.Info("file rotated", logEpoch, old.epoch, logTo, old.split.pos)
	f.cur, f.next = nil, nil
	f.use(next)
	f.announce(next)
	return true, old.close()
}

// upcoming returns the file now at the path when it is another file than the
// current one, or nil. It opens that file once and keeps it in f.next.
func (f *Feed) upcoming() (*fileSource, error) {
	fi, err := statPath(f.path)
	if err != nil {
		return nil, err
	}
	switch {
	case fi == nil || fileIDOf(fi).sameInode(f.cur.id):
		return nil, f.dropNext()
	case f.next != nil && fileIDOf(fi).sameInode(f.next.id):
		return f.next, nil
	}
	if err := f.dropNext(); err != nil {
		return nil, err
	}
	next, err := openFileSource(f.path, f.opts.MaxLine)
	if err != nil || next == nil {
		return nil, err
	}
	if next.id.sameInode(f.cur.id) { // the path changed again since the stat
		return nil, next.close()
	}
	f.next = next
	return next, nil
}

// dropNext closes the file kept as the next one, if any.
func (f *Feed) dropNext() error {
	err := f.closeSource(f.next)
	f.next = nil
	return err
}
