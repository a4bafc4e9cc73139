package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumPath is where .ci/run installs Chromium.
const chromiumPath = "/usr/bin/chromium"

// TestBrowser_Dashboard opens the dashboard of the real binary in headless
// Chromium and watches it follow the feed without a reload: the position
// as lines are appended, then the red badge and the loss listed after a
// completion failure is skipped.
func TestBrowser_Dashboard(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no %s (install chromium to run the browser test): %v", chromiumPath, err)
		}
		t.Fatalf("CI is set but %s is missing: %v", chromiumPath, err)
	}
	dir := t.TempDir()
	input := filepath.Join(dir, "ledger.csv")
	failFlag := filepath.Join(dir, "fail-commits")
	lines := "acct-1,10\nacct-2,5\n"
	if err := os.WriteFile(input, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + freePort(t)
	base := "http://" + addr
	start(t, []string{"OUTBOXD_TEST_FAIL_COMMITS=" + failFlag},
		"--db", filepath.Join(dir, "outboxd.db"), "--feed", "ledger=file:"+input, "--processor", "ledger=ledger",
		"--relay", "none", "--http", addr, "--on-completion-failure", "ledger=skip")
	wait(t, 15*time.Second, func() error { return httpOK(base + "/readyz") })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctx = browser(t, ctx)
	row := `tr.feed[data-feed="ledger"]`

	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	pos := len(lines)
	waitText(t, ctx, row+" td.position", fmt.Sprintf("%d / %d", pos, pos))
	// A mark on the page: a reload would wipe it.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.outboxdMark = "still here"`)); err != nil {
		t.Fatal(err)
	}

	appendFile(t, input, "acct-3,7\n")
	pos += len("acct-3,7\n")
	waitText(t, ctx, row+" td.position", fmt.Sprintf("%d / %d", pos, pos))
	waitText(t, ctx, row+" td.lossless", "lossless")

	// The next 5 commits fail: every try of the next batch (5 by default),
	// a completion failure, skipped under policy skip.
	if err := os.WriteFile(failFlag, []byte("5"), 0o644); err != nil {
		t.Fatal(err)
	}
	appendFile(t, input, "acct-4,1\n")
	lostFrom, lostTo := pos, pos+len("acct-4,1\n")
	waitText(t, ctx, row+" .badge.lossy", "NOT LOSSLESS")
	waitText(t, ctx, row+" ul.losses li", "completion failure skipped")
	waitText(t, ctx, row+" ul.losses li", fmt.Sprintf("partition 0, %d–%d", lostFrom, lostTo))
	mark, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.outboxdMark || ""`))
	if err != nil || mark != "still here" {
		t.Fatalf("the page was reloaded (mark %q, %v): it must update itself", mark, err)
	}

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := filepath.Join(t.ArtifactDir(), "dashboard.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshot: %s (kept with go test -artifacts)", shot)
}

// browser starts headless Chromium for the test and returns a tab's context.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-dev-shm-usage", true), // /dev/shm is small in containers
		chromedp.Flag("window-size", "1400,900"),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start %s: %v", chromiumPath, err)
	}
	return bctx
}

// waitText waits until the first element matching sel has text containing
// want. It reads the live page: no reload.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	q, _ := json.Marshal(sel)
	js := fmt.Sprintf(`(document.querySelector(%s) || {}).textContent || ""`, q)
	wait(t, 20*time.Second, func() error {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil {
			return fmt.Errorf("read %s: %w", sel, err)
		}
		if !strings.Contains(got, want) {
			return fmt.Errorf("%s shows %q, want %q", sel, got, want)
		}
		return nil
	})
}

// freePort returns a loopback port nothing listens on (as of now).
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

func httpOK(url string) error {
	res, err := http.Get(url)
	if err != nil {
		return err
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, res.Status)
	}
	return nil
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}
