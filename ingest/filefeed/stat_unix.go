//go:build unix

package filefeed

import (
	"io/fs"
	"syscall"
)

// devIno returns the device and inode number of a stat result.
func devIno(fi fs.FileInfo) (dev, ino uint64) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0
	}
	return uint64(st.Dev), uint64(st.Ino) //nolint:unconvert // the field types differ between platforms
}
