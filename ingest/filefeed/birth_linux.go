//go:build linux

package filefeed

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// birthTime returns when the file open as f was created, where the file
// system keeps it (ext4, xfs, btrfs, tmpfs); ok is false otherwise. A file
// truncated in place keeps its birth time; a new file on a reused inode has
// its own.
func birthTime(f *os.File) (t time.Time, ok bool) {
	var st unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_BTIME, &st); err != nil {
		return time.Time{}, false
	}
	if st.Mask&unix.STATX_BTIME == 0 {
		return time.Time{}, false
	}
	return time.Unix(st.Btime.Sec, int64(st.Btime.Nsec)), true
}
