package filefeed

import (
	"cmp"
	"compress/bzip2"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// compressedExts are the name endings of compressed generations. They are
// never read (see Feed), only fingerprinted where the standard library can
// decompress them (gzip, bzip2), to tell which file they hold.
var compressedExts = []string{".gz", ".bz2", ".xz", ".zst", ".lz4", ".lzma", ".Z", ".zip", ".br"}

// numberedDigits is the longest all-digit suffix read as a rotation count
// (".1", ".12"); longer ones are dates or times ("20261201", a Unix time).
const numberedDigits = 6

// listTries bounds how often a directory is listed back to back to get two
// listings that agree: a rotation that renames files while they are listed
// would otherwise show one file twice or hide one. Past listTries, listing
// goes on with a listPause between listings for at most listSettle.
const (
	listTries  = 5
	listPause  = time.Millisecond
	listSettle = 250 * time.Millisecond
)

// errUnsettled: the generations beside the path kept changing while they
// were listed, and no two listings agreed. A listing taken during a rotation
// may hide a generation (a rename moves it past the directory reader), and a
// generation missing from the chain is one the feed would move past unread:
// callers that can look again later do so, the others fail.
var errUnsettled = errors.New("the generations kept changing while they were listed")

// suffixRank is the place a generation's name gives it in its rotation
// scheme, for generations modified at the same time.
type suffixRank struct {
	numbered bool   // a rotation count: the higher, the older
	n        uint64 // the count, when numbered
	stem     string // otherwise a date or time: the lexically higher, the newer
}

// compare returns a negative number when r names an older generation than o,
// a positive one when a newer, 0 when the names do not tell. Numbered names
// count as older than dated ones: a scheme changed from numbers to dates
// leaves its numbered files behind.
func (r suffixRank) compare(o suffixRank) int {
	switch {
	case r.numbered && o.numbered:
		return cmp.Compare(o.n, r.n)
	case r.numbered:
		return -1
	case o.numbered:
		return 1
	}
	return strings.Compare(r.stem, o.stem)
}

// generationSuffix tells whether name (a base name in the path's directory)
// is a generation of the file named base, and how its rotation scheme ranks
// it. A generation's name is base, then '.', '-' or '_', then a rotation
// suffix, then optionally a compression ending (compressedExts). A rotation
// suffix starts with a digit and holds only digits and the characters of
// dates and times ("-", "_", ".", ":", "T"): a count (".1", ".2"), a date
// (logrotate's dateext "-20261201", Python's ".2026-12-01" or
// ".2026-12-01_13-00"), a date and a Unix time ("-20261201-1764590000").
// Other names beside the path (".bak", ".swp", "app.log.1.other") are not
// generations: a file is read again only when a rotation scheme made it.
func generationSuffix(base, name string) (rank suffixRank, compressed, ok bool) {
	rest, found := strings.CutPrefix(name, base)
	if !found || len(rest) < 2 || !strings.ContainsRune(".-_", rune(rest[0])) {
		return suffixRank{}, false, false
	}
	stem := rest[1:]
	for _, ext := range compressedExts {
		if s, cut := strings.CutSuffix(stem, ext); cut && s != "" {
			stem, compressed = s, true
			break
		}
	}
	if !rotationStem(stem) {
		return suffixRank{}, false, false
	}
	if len(stem) <= numberedDigits && strings.Trim(stem, "0123456789") == "" {
		n, err := strconv.ParseUint(stem, 10, 64)
		return suffixRank{numbered: true, n: n}, compressed, err == nil
	}
	return suffixRank{stem: stem}, compressed, true
}

// rotationStem reports whether s is a rotation suffix: a digit, then only
// digits and date and time separators.
func rotationStem(s string) bool {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return false
	}
	return strings.Trim(s, "0123456789-_.:T") == ""
}

// generation is a file beside the path that a rotation scheme made of it.
type generation struct {
	name       string // the path of the file
	id         fileID // device and inode; the fingerprint once read
	size       int64
	mtime      time.Time
	rank       suffixRank
	compressed bool
	held       *fileSource // the file, when the feed has it open already
}

// before reports whether g is an older generation than h. The modification
// time orders generations: a writer moves to the next generation only after
// its last write to the one before, and renaming or compressing a file
// (gzip, logrotate) keeps its time. Linux keeps times in ticks of a few
// milliseconds, so rotations faster than that tie; the rotation scheme's
// own order (suffixRank) breaks the tie, then the name.
func (g generation) before(h generation) bool {
	if !g.mtime.Equal(h.mtime) {
		return g.mtime.Before(h.mtime)
	}
	if c := g.rank.compare(h.rank); c != 0 {
		return c < 0
	}
	return g.name < h.name
}

// generations lists the generations of the feed's path (see
// listGenerations).
func (f *Feed) generations() ([]generation, error) { return listGenerations(f.path, f.listOnce) }

// listGenerations returns the generations of path, oldest first: the
// regular files in the path's directory whose names generationSuffix
// accepts, except the file now at the path itself. A compressed file whose
// uncompressed twin is also there is the twin being compressed, and left
// out. listOnce takes one listing (listGenerationsOnce). It lists until two
// listings in a row agree, so that renames during
// a rotation do not show a file twice or hide one, and returns an error
// wrapping errUnsettled when none did within listSettle. A missing
// directory has no generations.
func listGenerations(path string, listOnce func(string) ([]generation, error)) ([]generation, error) {
	var last []generation
	deadline := time.Now().Add(listSettle)
	for try := 0; ; try++ {
		gens, err := listOnce(path)
		if err != nil {
			return nil, err
		}
		if try > 0 && sameListing(gens, last) {
			return gens, nil
		}
		last = gens
		if try >= listTries {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("list generations of %s: %w", path, errUnsettled)
			}
			time.Sleep(listPause)
		}
	}
}

func listGenerationsOnce(path string) ([]generation, error) {
	dir, base := filepath.Dir(path), filepath.Base(path)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list generations of %s: %w", path, err)
	}
	var atPath fileID
	if fi, err := os.Stat(path); err == nil {
		atPath = fileIDOf(fi)
	}
	names := map[string]bool{}
	var gens []generation
	for _, e := range entries {
		rank, compressed, ok := generationSuffix(base, e.Name())
		if !ok {
			continue
		}
		name := filepath.Join(dir, e.Name())
		fi, err := os.Stat(name)
		if err != nil || !fi.Mode().IsRegular() {
			continue // gone since the listing, or not a file
		}
		id := fileIDOf(fi)
		if atPath != (fileID{}) && id.sameInode(atPath) {
			continue
		}
		names[name] = true
		gens = append(gens, generation{name: name, id: id, size: fi.Size(), mtime: fi.ModTime(), rank: rank, compressed: compressed})
	}
	gens = slices.DeleteFunc(gens, func(g generation) bool {
		return g.compressed && names[strings.TrimSuffix(g.name, filepath.Ext(g.name))]
	})
	slices.SortFunc(gens, func(a, b generation) int {
		if a.before(b) {
			return -1
		}
		if b.before(a) {
			return 1
		}
		return 0
	})
	return gens, nil
}

// sameListing reports whether two listings name the same files.
func sameListing(a, b []generation) bool {
	return len(a) == len(b) && slices.EqualFunc(a, b, func(x, y generation) bool {
		return x.name == y.name && x.id.sameInode(y.id)
	})
}

// chainMark is where the feed stands in the chain of generations: just after
// the file on inode id, or, when that file is not among them (deleted, or
// never known), after every generation modified before since (and at since
// too, unless strict).
type chainMark struct {
	id     fileID // the file passed last; its fingerprint, when known
	since  time.Time
	strict bool
}

// markOf is the mark just after s, the file read last.
func markOf(s *fileSource) chainMark {
	return chainMark{id: s.id, since: s.mtime}
}

// after returns the generations of gens (oldest first) that follow m. When
// m's file is not listed, a compressed generation with its modification
// time and its fingerprint is taken for it, compressed since it was opened.
func (m chainMark) after(gens []generation) []generation {
	if m.id != (fileID{}) {
		for i, g := range gens {
			if g.id.sameInode(m.id) {
				return gens[i+1:]
			}
		}
	}
	for i, g := range gens {
		switch {
		case g.mtime.Before(m.since) || m.strict && g.mtime.Equal(m.since):
			continue
		case g.compressed && g.mtime.Equal(m.since) && m.id.fp != "" && contentFingerprint(g.name) == m.id.fp:
			return gens[i+1:]
		}
		return gens[i:]
	}
	return nil
}

// contentFingerprint returns the fingerprint of what the compressed file
// name holds, or "" when it cannot be read (a format the standard library
// does not decompress, a damaged file).
func contentFingerprint(name string) string {
	f, err := os.Open(name)
	if err != nil {
		return ""
	}
	defer f.Close()
	var r io.Reader
	switch filepath.Ext(name) {
	case ".gz":
		zr, err := gzip.NewReader(f)
		if err != nil {
			return ""
		}
		defer zr.Close()
		r = zr
	case ".bz2":
		r = bzip2.NewReader(f)
	default:
		return ""
	}
	buf := make([]byte, fingerprintSize)
	n, err := io.ReadFull(r, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return ""
	}
	fp, _ := fileFingerprint(buf[:n])
	return fp
}

// compressedEpoch is the identity a compressed generation is reported lost
// under: its own device and inode, and the fingerprint of what it holds
// (or of its compressed bytes, when it cannot be decompressed here).
func compressedEpoch(g generation) string {
	id := g.id
	id.fp = contentFingerprint(g.name)
	if id.fp == "" {
		id.fp = rawFingerprint(g.name)
	}
	return id.String()
}

// rawFingerprint is the hex FNV-64a of the first fingerprintSize bytes of
// name as stored, for files whose content cannot be read as lines.
func rawFingerprint(name string) string {
	f, err := os.Open(name)
	if err != nil {
		return "0"
	}
	defer f.Close()
	buf := make([]byte, fingerprintSize)
	n, _ := io.ReadFull(f, buf)
	return hashHex(buf[:n])
}

// openGeneration opens g. It returns nil when g's name now holds another
// file (a rotation renamed it since it was listed).
func openGeneration(g generation, maxLine int) (*fileSource, error) {
	if g.held != nil {
		return g.held, nil
	}
	s, err := openFileSource(g.name, maxLine)
	if err != nil || s == nil {
		return nil, err
	}
	if !s.id.sameInode(g.id) {
		return nil, s.close()
	}
	return s, nil
}
