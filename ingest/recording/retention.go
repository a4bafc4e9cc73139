package recording

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// A feed's recording files in its directory: a run's parts
// (FEED-RUN-NNNN.rec), its snapshot (FEED-RUN.snapshot.db), and its gap
// mark (FEED-RUN.gap: the run stopped recording before its end, paused
// or failed, so no later run may reuse an earlier snapshot).
const (
	filePart     = "part"
	fileSnapshot = "snapshot"
	fileGap      = "gap"
)

// runPattern is a run's name: its start, UTC, to the nanosecond.
const runPattern = `[0-9]{8}T[0-9]{6}\.[0-9]{9}Z`

// diskFile is one of a feed's recording files.
type diskFile struct {
	name, run, kind string
	size            int64
	mod             time.Time
}

// feedFiles lists feed's recording files in dir, by run then name.
func feedFiles(dir, feed string) ([]diskFile, error) {
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(feed) + `-(` + runPattern + `)(-[0-9]{4}\.rec|\.snapshot\.db|\.gap)$`)
	found, err := listFiles(dir, re)
	if err != nil {
		return nil, err
	}
	out := make([]diskFile, 0, len(found))
	for _, f := range found {
		kind := filePart
		switch {
		case strings.HasSuffix(f.match[2], ".snapshot.db"):
			kind = fileSnapshot
		case f.match[2] == ".gap":
			kind = fileGap
		}
		out = append(out, diskFile{name: f.name, run: f.match[1], kind: kind, size: f.size, mod: f.mod})
	}
	slices.SortFunc(out, func(a, b diskFile) int {
		if c := strings.Compare(a.run, b.run); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	return out, nil
}

// listedFile is a regular file of a recordings directory whose name a
// pattern matched, with the pattern's submatches.
type listedFile struct {
	name  string
	match []string
	size  int64
	mod   time.Time
}

// listFiles lists the regular files in dir whose names re matches, in
// the directory's order: the one listing of a feed's files, for its
// recordings (feedFiles) and for the leftovers of files never finished
// (removeLeftovers). A file removed while it is listed is left out.
func listFiles(dir string, re *regexp.Regexp) ([]listedFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list recordings in %s: %w", dir, err)
	}
	var out []listedFile
	for _, e := range ents {
		m := re.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list recordings in %s: %w", dir, err)
		}
		out = append(out, listedFile{name: e.Name(), match: m, size: fi.Size(), mod: fi.ModTime()})
	}
	return out, nil
}

// generation is a snapshot and the runs that record from it (or, with no
// snapshot, one run): what a replay needs whole, and what retention
// removes whole.
type generation struct {
	runs  []string
	files []diskFile
	bytes int64
	last  time.Time // the newest file's modification
}

// generations groups files: a run with a snapshot of its own starts a
// generation, a run without one joins the one before it (it recorded
// from its snapshot) unless a gap mark ended that one, or it is the
// first.
func generations(files []diskFile) []generation {
	snap, gap := map[string]bool{}, map[string]bool{}
	var runs []string
	for _, f := range files {
		if len(runs) == 0 || runs[len(runs)-1] != f.run {
			runs = append(runs, f.run)
		}
		switch f.kind {
		case fileSnapshot:
			snap[f.run] = true
		case fileGap:
			gap[f.run] = true
		}
	}
	var gens []generation
	of := map[string]int{}
	for i, run := range runs {
		if i == 0 || snap[run] || gap[runs[i-1]] {
			gens = append(gens, generation{})
		}
		g := &gens[len(gens)-1]
		g.runs = append(g.runs, run)
		of[run] = len(gens) - 1
	}
	for _, f := range files {
		g := &gens[of[f.run]]
		g.files = append(g.files, f)
		g.bytes += f.size
		if f.mod.After(g.last) {
			g.last = f.mod
		}
	}
	return gens
}

// Retention bounds a feed's recordings on disk.
type Retention struct {
	// MaxAge removes a generation (a snapshot and the runs recorded from
	// it) whose newest file is older than this (0: no limit).
	MaxAge time.Duration
	// MaxTotalBytes removes the oldest generations while the feed's files
	// hold more than this (0: no limit). The newest generation is never
	// removed for it: the recorder pauses instead, until MaxAge (or an
	// operator) removes it.
	MaxTotalBytes int64
}

// retain removes, in dir, feed's generations past r's age or over its
// bytes, never the one holding run keep ("" for none: a recorder
// starting, or paused). room is what is about to be written (a new
// snapshot): the bytes must leave room for it. It returns the bytes left
// on disk and what it removed (files and bytes).
//
// newestToo lets the bytes remove the newest generation too (a run that
// starts a generation of its own: nothing older is needed).
func retain(dir, feed, keep string, newestToo bool, room int64, r Retention, now time.Time) (left int64, removedFiles int, removedBytes int64, err error) {
	files, err := feedFiles(dir, feed)
	if err != nil {
		return 0, 0, 0, err
	}
	gens := generations(files)
	for _, g := range gens {
		left += g.bytes
	}
	for i, g := range gens {
		if slices.Contains(g.runs, keep) {
			break // the one recorded into, and every one after it, stay
		}
		// The newest is never removed for bytes (the recorder pauses
		// instead), only for its age.
		old := r.MaxAge > 0 && now.Sub(g.last) > r.MaxAge
		over := (newestToo || i < len(gens)-1) && r.MaxTotalBytes > 0 && left+room > r.MaxTotalBytes
		if !old && !over {
			continue
		}
		for _, f := range g.files {
			if err := os.Remove(filepath.Join(dir, f.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return left, removedFiles, removedBytes, fmt.Errorf("retention: %w", err)
			}
			removedFiles++
			removedBytes += f.size
			left -= f.size
		}
	}
	return left, removedFiles, removedBytes, nil
}

// reusableSnapshot names the newest snapshot of feed in dir that a new
// run may record from: taken less than interval ago (by its run's name),
// with no gap mark at or after its run. "" when none.
func reusableSnapshot(dir, feed string, interval time.Duration, now time.Time) (name, run string, err error) {
	if interval <= 0 {
		return "", "", nil
	}
	files, err := feedFiles(dir, feed)
	if err != nil {
		return "", "", err
	}
	for i := len(files) - 1; i >= 0; i-- {
		f := files[i]
		if f.kind == fileGap {
			return "", "", nil
		}
		if f.kind != fileSnapshot {
			continue
		}
		at, err := time.Parse("20060102T150405.000000000Z", f.run)
		if err != nil || now.Sub(at) >= interval || now.Before(at) {
			return "", "", nil
		}
		return f.name, f.run, nil
	}
	return "", "", nil
}

// leftoverPattern is what a process killed while creating a file leaves:
// a snapshot's temporary copy (FEED-RUN.snapshot.db.tmp) and SQLite's
// files beside it (-journal, -wal, -shm), or a part not yet renamed to
// its name (FEED-RUN-NNNN.rec.tmp: it appears whole or not at all).
// Nothing refers to them, and retention, which counts only recordings,
// would never remove them: a crash loop would fill the disk past the
// total cap unseen.
const leftoverPattern = `(\.snapshot\.db\.tmp(-journal|-wal|-shm)?|-[0-9]{4}\.rec\.tmp)$`

// removeLeftovers removes feed's leftovers of files that were never
// finished, in dir: only at a recorder's start, when none of the feed's
// is being created (one process records a feed: it holds the database's
// claim). It returns the files and bytes removed.
func removeLeftovers(dir, feed string) (files int, bytes int64, err error) {
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(feed) + `-` + runPattern + leftoverPattern)
	found, err := listFiles(dir, re)
	if err != nil {
		return 0, 0, err
	}
	for _, f := range found {
		if err := os.Remove(filepath.Join(dir, f.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return files, bytes, fmt.Errorf("remove an unfinished snapshot: %w", err)
		}
		files++
		bytes += f.size
	}
	return files, bytes, nil
}
