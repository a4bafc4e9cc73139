package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// PageSize is the page size, in bytes, of a database the store creates.
// SQLite's default is 4096. With 16 KiB pages a batch's outbox rows fill a
// quarter as many pages, each with one header, one WAL frame and one
// checkpoint copy, and the state's B-tree is a level shallower: less CPU
// a line in `server bench` (figures: docs/performance.md).
const PageSize = 16384

// walBytes is about how large the WAL grows before a commit checkpoints
// it: SQLite's default of 1,000 pages, counted in 4 KiB pages. SQLite
// counts the threshold in pages, so with 16 KiB pages the default would
// let the WAL grow to 16 MiB between checkpoints, four times the disk it
// took before. Measured at 16 KiB pages, 256 pages and 1,000 made no
// difference beyond the noise (figures: docs/performance.md).
const walBytes = 4 << 20

// walCheckpointPages is the writer's wal_autocheckpoint for the database
// at path: walBytes in its pages. The page size is read from the
// database header (bytes 16-17, 1 meaning 65536); a database with no
// header yet has PageSize pages.
func walCheckpointPages(path string) int {
	size := PageSize
	if f, err := os.Open(path); err == nil {
		var b [2]byte
		if n, err := f.ReadAt(b[:], 16); n == 2 && err == nil {
			switch v := int(b[0])<<8 | int(b[1]); {
			case v == 1:
				size = 65536
			case v >= 512 && v&(v-1) == 0:
				size = v
			}
		}
		f.Close()
	}
	return max(1, walBytes/size)
}

// initPageSize gives a database that does not exist yet PageSize pages.
// SQLite fixes a database's page size when it writes its first page, and
// in WAL mode it cannot change it afterwards. The driver runs a DSN's
// pragmas sorted by name, journal_mode before page_size, so a new database
// is first set up on a connection of its own: page size, then WAL, which
// writes the first page. A database that exists (its file or its WAL)
// keeps the page size it has; one another store is creating at the same
// moment is left to it.
func initPageSize(ctx context.Context, path string) error {
	for _, p := range []string{path, path + "-wal"} {
		switch _, err := os.Stat(p); {
		case err == nil:
			return nil
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("look for database %s: %w", p, err)
		}
	}
	db, err := sql.Open("sqlite", "file:"+uriPath.Replace(path)+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return fmt.Errorf("create database %s: %w", path, err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, fmt.Sprintf("PRAGMA page_size = %d", PageSize)); err != nil {
		return fmt.Errorf("create database %s: set page size: %w", path, err)
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode = wal").Scan(&mode); err != nil {
		if isBusy(err) {
			// Another store is creating the database at this moment, with
			// these pages; the open that follows waits for it.
			return nil
		}
		return fmt.Errorf("create database %s: set WAL mode: %w", path, err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("create database %s: %w", path, err)
	}
	return nil
}
