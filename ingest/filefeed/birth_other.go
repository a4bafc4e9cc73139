//go:build !linux

package filefeed

import (
	"os"
	"time"
)

// birthTime reports no birth time where the feed does not read one: a new
// file on a reused inode is then told from a truncated one only by the
// generations beside it (see Feed.replacedInPlace).
func birthTime(*os.File) (time.Time, bool) { return time.Time{}, false }
