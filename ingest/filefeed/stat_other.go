//go:build !unix

package filefeed

import "io/fs"

// devIno returns zeros where the platform has no inode numbers: a file's
// identity is then its fingerprint alone, and a rotation whose new file starts
// with the same line as the old one goes unnoticed.
func devIno(fs.FileInfo) (dev, ino uint64) { return 0, 0 }
