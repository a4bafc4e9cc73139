package filefeed

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// fingerprintSize bounds the bytes a fingerprint covers when a file's first
// line is longer.
const fingerprintSize = 1024

// fileID identifies a file: its device and inode, and a fingerprint of its
// first line. The inode alone is not enough: a deleted file's inode is reused,
// and a file truncated in place keeps it.
type fileID struct {
	dev, ino uint64
	fp       string // "" until the file has a first line (or fingerprintSize bytes)
}

// String formats the identity as "dev:inode:fingerprint".
func (id fileID) String() string {
	return fmt.Sprintf("%d:%d:%s", id.dev, id.ino, id.fp)
}

// sameInode reports whether both name the same inode on the same device.
func (id fileID) sameInode(o fileID) bool { return id.dev == o.dev && id.ino == o.ino }

// fileIDOf returns the device and inode of a stat result, without fingerprint.
func fileIDOf(fi fs.FileInfo) fileID {
	dev, ino := devIno(fi)
	return fileID{dev: dev, ino: ino}
}

// fileFingerprint is the one definition of a file's fingerprint: the hex
// FNV-64a of its first line including the "\n", or of its first
// fingerprintSize bytes when no "\n" occurs within them. prefix is the start
// of the file; ok is false while it is too short to tell.
func fileFingerprint(prefix []byte) (fp string, ok bool) {
	prefix = prefix[:min(len(prefix), fingerprintSize)]
	switch i := bytes.IndexByte(prefix, '\n'); {
	case i >= 0:
		prefix = prefix[:i+1]
	case len(prefix) < fingerprintSize:
		return "", false
	}
	return hashHex(prefix), true
}

// hashHex is the hex FNV-64a of b, the hash fingerprints are made of.
func hashHex(b []byte) string {
	h := fnv.New64a()
	h.Write(b) // a hash.Hash never returns an error
	return fmt.Sprintf("%016x", h.Sum64())
}

// readFingerprint reads the start of f into buf (at least fingerprintSize
// bytes long) and returns its fingerprint; ok is false while it has none.
func readFingerprint(f *os.File, buf []byte) (fp string, ok bool, err error) {
	n, err := f.ReadAt(buf[:fingerprintSize], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", false, fmt.Errorf("read start of %s: %w", f.Name(), err)
	}
	fp, ok = fileFingerprint(buf[:n])
	return fp, ok, nil
}

// fileEpoch is a file feed's epoch: the identity of the file read, and a
// generation that counts how often that inode started over (truncated in
// place, or reused) in this feed's history. Formatted "dev:inode:fp" for
// generation 0 and "dev:inode:fp:tN" after.
type fileEpoch struct {
	id  fileID
	gen int
}

func (e fileEpoch) String() string {
	if e.gen == 0 {
		return e.id.String()
	}
	return e.id.String() + ":t" + strconv.Itoa(e.gen)
}

// parseFileEpoch parses what fileEpoch.String formats; ok is false for
// anything else (an epoch another version or feed kind wrote).
func parseFileEpoch(s string) (e fileEpoch, ok bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 && len(parts) != 4 {
		return fileEpoch{}, false
	}
	dev, err1 := strconv.ParseUint(parts[0], 10, 64)
	ino, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || parts[2] == "" {
		return fileEpoch{}, false
	}
	e = fileEpoch{id: fileID{dev: dev, ino: ino, fp: parts[2]}}
	if len(parts) == 4 {
		gen, err := strconv.Atoi(strings.TrimPrefix(parts[3], "t"))
		if !strings.HasPrefix(parts[3], "t") || err != nil || gen < 1 {
			return fileEpoch{}, false
		}
		e.gen = gen
	}
	return e, true
}

// nextFileEpoch returns the epoch of the file id when it follows the epoch
// prev. A file on another inode gets its plain identity. A file on prev's
// inode (truncated in place, or the inode reused) gets prev's generation plus
// one, so its epoch differs from prev even when its first line is the same:
// otherwise items at positions up to the stored one would be skipped as
// replays.
func nextFileEpoch(id fileID, prev string) string {
	p, ok := parseFileEpoch(prev)
	if !ok || !p.id.sameInode(id) {
		return fileEpoch{id: id}.String()
	}
	return fileEpoch{id: id, gen: p.gen + 1}.String()
}
