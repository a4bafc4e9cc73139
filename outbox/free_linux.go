package outbox

import (
	"fmt"
	"os"
	"syscall"
)

// freeBytes is the space on dir's file system that this process may write
// into: root may use the blocks reserved for it, others may not.
func freeBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	blocks := st.Bavail
	if os.Geteuid() == 0 {
		blocks = st.Bfree
	}
	return blocks * uint64(st.Bsize), nil
}

// freeKnown says freeBytes measures.
const freeKnown = true
