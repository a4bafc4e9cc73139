package filefeed

import "bytes"

// fileLine is a complete line found by a lineSplitter.
type fileLine struct {
	// value is the line without its "\n" and a trailing "\r", cut to the
	// splitter's limit. It is a fresh copy: no later input overwrites it.
	value []byte
	// end is the position just after the line's "\n".
	end int64
	// size is the length of the whole line without "\n" and trailing "\r".
	size int64
	// tooLong is set when size is over the limit and value holds its start.
	tooLong bool
	// cr is set when a "\r" before the "\n" was dropped from value.
	cr bool
}

// lineSplitter cuts a byte stream, given in chunks of any size, into lines
// ending with "\n". It keeps at most max bytes of an unfinished line, however
// long the line grows, and never touches the filesystem, so it can be tested
// (and fuzzed) alone.
//
// Use: push a chunk, call next until it returns false, push the next chunk.
// A chunk is read in place until next returns false, so the caller must not
// overwrite it before then.
type lineSplitter struct {
	max   int    // the longest line value kept whole
	pos   int64  // the position just after the last complete line
	in    []byte // pushed input not split yet
	part  []byte // the first bytes (at most max) of the unfinished line
	partN int64  // the unfinished line's length so far
	last  byte   // the unfinished line's last byte, to see a "\r" that part did not keep
	arena lineArena
}

// newLineSplitter returns a splitter whose positions start at pos.
func newLineSplitter(maxLine int, pos int64) *lineSplitter {
	return &lineSplitter{max: maxLine, pos: pos}
}

// push gives the splitter the next chunk of input. The previous chunk must be
// used up (next returned false).
func (s *lineSplitter) push(chunk []byte) { s.in = chunk }

// fed returns the position after every byte pushed so far.
func (s *lineSplitter) fed() int64 { return s.pos + s.partN + int64(len(s.in)) }

// reset drops every byte not yet split and starts over at pos.
func (s *lineSplitter) reset(pos int64) {
	s.pos, s.in, s.part, s.partN, s.last = pos, nil, s.part[:0], 0, 0
}

// next returns the next complete line of the pushed input. At the end of the
// input it keeps the unfinished line's start and returns false.
func (s *lineSplitter) next() (fileLine, bool) {
	i := bytes.IndexByte(s.in, '\n')
	if i < 0 {
		s.keep(s.in)
		s.in = nil
		return fileLine{}, false
	}
	head, n, last := s.in[:i], int64(i), byte(0)
	if i > 0 {
		last = s.in[i-1]
	}
	if s.partN > 0 {
		s.keep(head)
		head, n, last = s.part, s.partN, s.last
	}
	s.in = s.in[i+1:]
	s.pos += n + 1
	s.part, s.partN, s.last = s.part[:0], 0, 0
	return s.cut(head, n, last), true
}

// keep adds b to the unfinished line, keeping only its first max bytes.
func (s *lineSplitter) keep(b []byte) {
	if len(b) == 0 {
		return
	}
	room := max(s.max-len(s.part), 0)
	s.part = append(s.part, b[:min(room, len(b))]...)
	s.partN += int64(len(b))
	s.last = b[len(b)-1]
}

// cut makes the line of length n (without "\n") whose first bytes are head
// and whose last byte is last.
func (s *lineSplitter) cut(head []byte, n int64, last byte) fileLine {
	cr := last == '\r'
	if cr {
		n--
	}
	l := fileLine{end: s.pos, size: n, cr: cr}
	if n > int64(s.max) {
		l.tooLong, n = true, int64(s.max)
	}
	l.value = s.arena.copy(head[:n])
	return l
}

// lineArenaSlab is the size of the arrays a lineArena copies small values to.
const lineArenaSlab = 64 << 10

// lineArena copies line values into shared append-only arrays: one
// allocation serves many lines, and a handed-out value is never overwritten.
// A value keeps its whole array alive for as long as it is referenced.
type lineArena struct{ slab []byte }

// copy returns a copy of b (non-nil, even when empty) with its capacity
// capped, so appending to it cannot reach another value.
func (a *lineArena) copy(b []byte) []byte {
	if len(b) > lineArenaSlab/8 {
		return append(make([]byte, 0, len(b)), b...)
	}
	if a.slab == nil || cap(a.slab)-len(a.slab) < len(b) {
		a.slab = make([]byte, 0, lineArenaSlab)
	}
	start := len(a.slab)
	a.slab = append(a.slab, b...)
	return a.slab[start:len(a.slab):len(a.slab)]
}
