package recording

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// ErrBadSet: the recordings given cannot be replayed together (several
// feeds, the same file twice, or one that does not start where the one
// before it ended).
var ErrBadSet = errors.New("recordings do not make one replay")

// IsBad reports whether err says a recording cannot be read or replayed
// as given (ErrNotRecording, ErrVersion, ErrCorrupt, ErrBadRecord,
// ErrBadSet), as opposed to a failure of the replay itself.
func IsBad(err error) bool {
	for _, e := range []error{ErrNotRecording, ErrVersion, ErrCorrupt, ErrBadRecord, ErrBadSet} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// File is one recording of a Set, as Scan read it.
type File struct {
	Path   string
	Header Header
	// Txns counts its committed transactions, Items the items in them.
	Txns, Items int64
	Tail        Tail
	// Confirmed is set when Tail.Unconfirmed committed: the next file of
	// the set starts right after it. A replay applies it then.
	Confirmed bool
	// end is where the file leaves each partition.
	end map[int32]outbox.Checkpoint
}

// Set is recordings of one feed that follow each other: each starts where
// the one before it ended.
type Set struct {
	Files []File
	// MaxItemBytes is the largest item the recordings hold (key, value
	// and headers), at least 1.
	MaxItemBytes int
}

// Header is the first file's header.
func (s *Set) Header() Header { return s.Files[0].Header }

// From is where the set starts.
func (s *Set) From() map[int32]outbox.Checkpoint { return s.Files[0].Header.Checkpoints() }

// Scan reads the recordings at paths (files, or directories whose *.rec
// files are taken), orders them by run and part, and checks they make one
// replay: one feed, no file twice, each starting where the one before it
// ended. A transaction left unconfirmed at the end of a file counts as
// committed when the next file starts right after it. Errors wrap
// ErrBadSet or the reader's errors (see IsBad).
func Scan(paths []string) (*Set, error) {
	files, err := expand(paths)
	if err != nil {
		return nil, err
	}
	set := &Set{MaxItemBytes: 1}
	for _, p := range files {
		f, maxItem, err := scanFile(p)
		if err != nil {
			return nil, err
		}
		set.Files = append(set.Files, f)
		set.MaxItemBytes = max(set.MaxItemBytes, maxItem)
	}
	slices.SortStableFunc(set.Files, func(a, b File) int {
		if c := a.Header.StartedAt.Compare(b.Header.StartedAt); c != 0 {
			return c
		}
		if c := strings.Compare(a.Header.Run, b.Header.Run); c != 0 {
			return c
		}
		return a.Header.Part - b.Header.Part
	})
	if err := set.join(); err != nil {
		return nil, err
	}
	return set, nil
}

// expand lists the recording files of paths.
func expand(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadSet, err)
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		found, err := filepath.Glob(filepath.Join(p, "*.rec"))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadSet, err)
		}
		out = append(out, found...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no recording files in %s", ErrBadSet, strings.Join(paths, ", "))
	}
	return out, nil
}

// scanFile reads a whole recording, checking every frame.
func scanFile(path string) (File, int, error) {
	r, err := Open(path)
	if err != nil {
		return File{}, 0, err
	}
	defer r.Close()
	f := File{Path: path, Header: r.Header(), end: r.Header().Checkpoints()}
	maxItem := 0
	for {
		txn, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return File{}, 0, err
		}
		f.Txns++
		f.end = txn.Checkpoints
		for _, e := range txn.Entries {
			if e.Record.Kind == ingest.RecordItem {
				f.Items++
				maxItem = max(maxItem, itemSize(e.Record.Item))
			}
		}
	}
	f.Tail = r.Tail()
	if u := f.Tail.Unconfirmed; u != nil {
		for _, e := range u.Entries {
			if e.Record.Kind == ingest.RecordItem {
				maxItem = max(maxItem, itemSize(e.Record.Item))
			}
		}
	}
	return f, maxItem, nil
}

func itemSize(it ingest.Item) int {
	n := len(it.Key) + len(it.Value)
	for _, h := range it.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// join checks the files follow each other, and confirms the unconfirmed
// transactions the next file shows committed.
func (s *Set) join() error {
	first := s.Files[0].Header
	seen := map[string]string{}
	for i := range s.Files {
		f := &s.Files[i]
		h := f.Header
		if h.Feed != first.Feed {
			return fmt.Errorf("%w: %s records feed %s, %s feed %s: replay one feed at a time",
				ErrBadSet, s.Files[0].Path, first.Feed, f.Path, h.Feed)
		}
		id := fmt.Sprintf("%s part %d", h.Run, h.Part)
		if prev, ok := seen[id]; ok {
			return fmt.Errorf("%w: %s and %s are both run %s", ErrBadSet, prev, f.Path, id)
		}
		seen[id] = f.Path
		var next *File
		if i+1 < len(s.Files) {
			next = &s.Files[i+1]
		}
		if err := f.checkSuccessor(next); err != nil {
			return err
		}
		if i == 0 {
			continue
		}
		prev := &s.Files[i-1]
		from := h.Checkpoints()
		if u := prev.Tail.Unconfirmed; u != nil && sameCheckpoints(u.Checkpoints, from) && !sameCheckpoints(prev.end, from) {
			prev.Confirmed, prev.end = true, maps.Clone(u.Checkpoints)
		}
		if !sameCheckpoints(prev.end, from) {
			return fmt.Errorf("%w: %s ends at %s (its last transaction ends at offset %d), but %s starts at %s: "+
				"a recording between them is missing, or one stopped early",
				ErrBadSet, prev.Path, describeCheckpoints(prev.end), prev.Tail.Offset, f.Path, describeCheckpoints(from))
		}
	}
	return nil
}

// checkSuccessor checks f's end against next, the file that follows it
// in the set (nil: none). A part that names its successor must be
// followed by it, or be the last file given with its successor still on
// disk beside it (a replay of the first parts, the rest later); a part
// followed by a later part of its run must name it (unless it ends
// right after its last commit: a crash can come between making the next
// part and naming it), and a run's end is its last part.
func (f *File) checkSuccessor(next *File) error {
	t := f.Tail
	sameRun := next != nil && next.Header.Run == f.Header.Run
	switch {
	case t.Next != "" && sameRun && next.Header.Part == t.NextPart:
		return nil
	case t.Next != "":
		onDisk := filepath.Join(filepath.Dir(f.Path), t.Next)
		_, err := os.Stat(onDisk)
		switch {
		case err == nil && next == nil:
			return nil
		case err == nil:
			return fmt.Errorf("%w: %s: offset %d names the part that follows it, %s, which is not among the recordings given",
				ErrBadSet, f.Path, t.EndOffset, onDisk)
		}
		return fmt.Errorf("%w: %s: offset %d names the part that follows it, %s, which is missing: the run's later parts are gone",
			ErrBadSet, f.Path, t.EndOffset, onDisk)
	case sameRun && t.Ended:
		return fmt.Errorf("%w: %s: offset %d ends run %s, yet %s is part %d of it",
			ErrBadSet, f.Path, t.EndOffset, f.Header.Run, next.Path, next.Header.Part)
	case sameRun && next.Header.Part == f.Header.Part+1 && t.Bytes == 0:
		// It ends after its last commit: the process stopped after it
		// made the next part and before it named it here.
		return nil
	case sameRun:
		why := "no record ends it"
		if t.Torn != "" {
			why = t.Torn
		} else if t.Unconfirmed != nil {
			why = fmt.Sprintf("transaction %d has no commit record", t.Unconfirmed.Number)
		}
		return fmt.Errorf("recording %s: %w: offset %d: the part ends without naming the part that follows it (%s), yet %s is part %d of its run",
			f.Path, ErrCorrupt, t.Offset, why, next.Path, next.Header.Part)
	}
	return nil
}

// End is where the set leaves each partition: after its last committed
// (or confirmed) transaction.
func (s *Set) End() map[int32]outbox.Checkpoint { return s.Files[len(s.Files)-1].end }
