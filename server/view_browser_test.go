package server

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// chromium finds a headless browser: Debian's chromium, which
// scripts/install-deps.sh installs. Without one the browser test is
// skipped, except in CI, where it must run.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium on PATH: scripts/install-deps.sh installs Debian's, and CI runs the live view's browser test")
	}
	t.Skip("no chromium on PATH (scripts/install-deps.sh installs it): the live view is not tested in a browser")
	return ""
}

// dumpDOM loads url in a fresh headless chromium and returns the page's
// DOM once its script has run for a few seconds of the page's time
// (virtual time: the browser fast-forwards timers and waits for the
// network, so no wall-clock wait decides the result).
func dumpDOM(t *testing.T, browser, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	profile := filepath.Join(t.TempDir(), "profile")
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--user-data-dir="+profile,
		"--virtual-time-budget=3000", "--dump-dom", url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, stderr.String())
	}
	return string(out)
}

// The live view in a real browser: its script fills the table and puts
// each chart's SVG in the page, with a line for the running job; sources
// are hashed unless the page's address carries the token.
func TestViewInBrowser(t *testing.T) {
	browser := chromium(t)
	s, id, data := liveView(t)
	url := "http://" + s.MetricsAddr() + "/view/"

	dom := dumpDOM(t, browser, url)
	charts := regexp.MustCompile(`(?s)<figure class="chart" data-chart="(\w+)">(.*?)</figure>`).FindAllStringSubmatch(dom, -1)
	if len(charts) != len(viewCharts) {
		t.Fatalf("%d charts on the page, want %d:\n%s", len(charts), len(viewCharts), dom)
	}
	for _, c := range charts {
		name, body := c[1], c[2]
		if !strings.Contains(body, "<svg") || !strings.Contains(body, "<path") {
			t.Errorf("chart %s was not drawn:\n%s", name, body)
		}
		if (name == "samples" || name == "position") && !strings.Contains(body, ">job "+id+"<") {
			t.Errorf("chart %s has no line for job %s:\n%s", name, id, body)
		}
	}
	jobRow := regexp.MustCompile(`<tr class="job"><td></td><td>` + id + `</td><td class="num">500</td>`)
	if !jobRow.MatchString(dom) {
		t.Fatalf("the table has no row for job %s:\n%s", id, dom)
	}
	if !regexp.MustCompile(`<tr class="group"><td>[0-9a-f]{12}</td>`).MatchString(dom) || strings.Contains(dom, filepath.Dir(data)) {
		t.Fatalf("without the token the page shows a path, or no hash:\n%s", dom)
	}
	if !strings.Contains(dom, "sources hashed (no token)") {
		t.Fatalf("the page's state line:\n%s", dom)
	}

	dom = dumpDOM(t, browser, url+"#token=secret")
	if !strings.Contains(dom, `<tr class="group"><td>`+data+` (fixed)</td>`) || !jobRow.MatchString(dom) {
		t.Fatalf("with the token the page does not show the path:\n%s", dom)
	}
	dom = dumpDOM(t, browser, url+"#token=guess")
	if !strings.Contains(dom, "the daemon did not answer") || strings.Contains(dom, data) {
		t.Fatalf("with a wrong token the page shows data:\n%s", dom)
	}
}
