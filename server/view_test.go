package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// liveView starts a daemon whose metrics listener serves the live view,
// sampling every 20ms, with one job open that has taken three batches:
// the view has sampled it at least twice since. It returns the daemon,
// the job's id and the dataset's path.
func liveView(t *testing.T) (*Server, string, string) {
	t.Helper()
	s := &Server{Metrics: "127.0.0.1:0", Token: "secret", viewEvery: 20 * time.Millisecond}
	cl, data := daemon(t, s)
	op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 128, Shuffle: true, BatchSize: 64}})
	if op.Op != wire.OpOpened {
		t.Fatalf("open: %+v", op)
	}
	for range 3 {
		b := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
		if b.Op != wire.OpBatch {
			t.Fatalf("next: %+v", b)
		}
		cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: op.Job, Seqs: []uint64{b.Seq}})
	}
	id := fmt.Sprint(op.Job)
	// Two samples that see the job at its place: the charts then have a
	// line for it.
	eventually(t, "the view samples the job twice at its place", func() bool {
		n := 0
		for _, smp := range s.view.samples() {
			if j, ok := findJob(smp, id); ok && j.Position == 192 {
				n++
			}
		}
		return n >= 2
	})
	return s, id, data
}

// viewGet asks the daemon's metrics listener for path, with an
// Authorization header if auth is set.
func viewGet(t *testing.T, s *Server, path, auth string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+s.MetricsAddr()+path, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // no idle connection outlives the test
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The page, its table and its charts, from a real daemon running a job:
// sources hashed without the token, paths with it, nothing with a wrong
// one.
func TestView(t *testing.T) {
	s, id, data := liveView(t)
	code, page := viewGet(t, s, "/view/", "")
	if code != 200 || !strings.Contains(page, `src="view.js"`) || !strings.Contains(page, `data-chart="samples"`) {
		t.Fatalf("the page (%d):\n%s", code, page)
	}
	if code, js := viewGet(t, s, "/view/view.js", ""); code != 200 || !strings.Contains(js, "chart/") {
		t.Fatalf("the page's script (%d):\n%s", code, js)
	}

	var d viewData
	code, body := viewGet(t, s, "/view/data.json", "")
	if err := json.Unmarshal([]byte(body), &d); code != 200 || err != nil {
		t.Fatalf("data.json (%d, %v):\n%s", code, err, body)
	}
	if len(d.Status.Groups) != 1 || len(d.Status.Groups[0].Jobs) != 1 || d.Status.Groups[0].Jobs[0].ID != id || d.Samples < 2 {
		t.Fatalf("data.json lacks the job %s:\n%s", id, body)
	}
	if j := d.Status.Groups[0].Jobs[0]; j.Subset != 500 || j.Position != 192 || j.Epoch != 0 {
		t.Fatalf("the job's place: %+v", j)
	}
	if _, ok := d.Rates[id]; !ok {
		t.Fatalf("no recent rate for job %s:\n%s", id, body)
	}
	if !regexp.MustCompile(`^[0-9a-f]{12}$`).MatchString(d.Status.Groups[0].Source) || strings.Contains(body, filepath.Dir(data)) {
		t.Fatalf("data.json without the token names a path:\n%s", body)
	}
	if d.Status.Groups[0].Source != s.hashPath(data+" (fixed)") {
		t.Fatalf("the view's hash %q is not /metrics's", d.Status.Groups[0].Source)
	}
	if len(d.Devices) == 0 || d.Devices[0].Bytes < 3*64*128 || d.Devices[0].Name == "" {
		t.Fatalf("devices %+v: the job's reads are not counted", d.Devices)
	}
	if code, body = viewGet(t, s, "/view/data.json", "Bearer secret"); code != 200 || !strings.Contains(body, `"source":"`+data) {
		t.Fatalf("data.json with the token (%d):\n%s", code, body)
	}

	for name, want := range map[string][]string{
		"samples":  {"job " + id, "samples/s"},
		"position": {"job " + id, "epoch"},
		"cache":    {"held", "budget", "MB"},
		"hits":     {"%"}, // the test's job asks the cache nothing: no line
		"devices":  {d.Devices[0].Name, "MB/s"},
		"inflight": {d.Devices[0].Name, "reads"},
	} {
		code, svg := viewGet(t, s, "/view/chart/"+name+".svg", "")
		if code != 200 || !strings.Contains(svg, "<svg") || !strings.Contains(svg, "</svg>") {
			t.Fatalf("chart %s (%d):\n%s", name, code, svg)
		}
		for _, w := range want {
			if !strings.Contains(svg, ">"+w+"<") {
				t.Errorf("chart %s lacks the text %q", name, w)
			}
		}
		if strings.Contains(svg, filepath.Dir(data)) {
			t.Errorf("chart %s names the dataset's path", name)
		}
	}
	if code, _ := viewGet(t, s, "/view/chart/nope.svg", ""); code != http.StatusNotFound {
		t.Fatalf("an unknown chart: %d", code)
	}
	for _, path := range []string{"/view/", "/view/data.json", "/view/chart/samples.svg"} {
		if code, body := viewGet(t, s, path, "Bearer guess"); code != http.StatusUnauthorized || strings.Contains(body, data) {
			t.Fatalf("%s with a wrong token (%d):\n%s", path, code, body)
		}
	}
}

// The ring keeps the last viewSamples samples, oldest first.
func TestViewRing(t *testing.T) {
	var v viewRing
	t0 := time.Unix(1000, 0)
	for i := range viewSamples + 17 {
		v.add(viewSample{at: t0.Add(time.Duration(i) * time.Second)})
	}
	all := v.samples()
	if len(all) != viewSamples {
		t.Fatalf("%d samples kept", len(all))
	}
	for i, s := range all {
		if want := t0.Add(time.Duration(i+17) * time.Second); !s.at.Equal(want) {
			t.Fatalf("sample %d at %v, want %v", i, s.at, want)
		}
	}
}

// Rates between two samples, against the arithmetic done by hand.
func TestViewRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	sample := func(at time.Duration, epoch, pos int, hits, misses, bytes, inFlight int64) viewSample {
		return viewSample{at: t0.Add(at), status: &wire.Status{
			Cache:  wire.CacheStatus{Hits: hits, Misses: misses},
			Groups: []wire.GroupStatus{{Jobs: []wire.JobStatus{{ID: "7", Subset: 1000, Epoch: epoch, Position: pos}}}}},
			devices: []job.Device{{ID: 5, Stats: storage.EngineStats{Bytes: bytes, InFlight: inFlight}}}}
	}
	a := sample(0, 0, 900, 10, 10, 1e6, 3)
	b := sample(2*time.Second, 1, 100, 40, 20, 5e6, 4)
	if r, ok := jobRate(a, b, "7"); !ok || r != 100 { // 200 records across an epoch's end in 2s
		t.Errorf("job rate %v %v", r, ok)
	}
	if _, ok := jobRate(a, b, "8"); ok {
		t.Error("a rate for a job in neither sample")
	}
	if h, ok := hitRate(a, b); !ok || h != 75 { // 30 hits, 10 misses
		t.Errorf("hit rate %v %v", h, ok)
	}
	if _, ok := hitRate(a, a); ok {
		t.Error("a hit rate with no lookups")
	}
	if m, ok := deviceRate(a, b, 5); !ok || m != 2 { // 4 MB in 2s
		t.Errorf("device rate %v %v", m, ok)
	}
	if m, ok := deviceRate(viewSample{at: t0, status: a.status}, b, 5); !ok || m != 2.5 { // first read between them
		t.Errorf("a new device's rate %v %v", m, ok)
	}
}

// A chart is drawn once per sample, however many requests ask for it
// (anyone can, with no token, every two seconds from each page): 20
// requests of one chart between two samples draw it once, the same bytes
// each, and a new sample draws it once more. (Each request drew it: ~40 ms
// of CPU at 100 jobs, growing as jobs² × samples.)
func TestChartsAreDrawnOncePerSample(t *testing.T) {
	drawn := 0
	c := viewCharts["samples"]
	lines := c.lines
	c.lines = func(all []viewSample, name func(uint64) string) []viewSeries {
		drawn++ // under the view's drawing lock, or the race detector says
		return lines(all, name)
	}
	viewCharts["chart-test"] = c
	defer delete(viewCharts, "chart-test")
	s := &Server{Metrics: "127.0.0.1:0", viewEvery: time.Hour} // one sample at start, then none unless added
	daemon(t, s)
	eventually(t, "the view's first sample", func() bool { return len(s.view.samples()) == 1 })
	var first string
	for i := range 20 {
		code, svg := viewGet(t, s, "/view/chart/chart-test.svg", "")
		if code != 200 || (i > 0 && svg != first) {
			t.Fatalf("request %d: %d, the same chart: %v", i, code, svg == first)
		}
		first = svg
	}
	if drawn != 1 {
		t.Fatalf("20 requests between two samples drew the chart %d times", drawn)
	}
	s.view.add(viewSample{at: time.Now(), status: s.status(), devices: s.env.Devices()})
	for range 5 {
		viewGet(t, s, "/view/chart/chart-test.svg", "")
	}
	if drawn != 2 {
		t.Fatalf("after one more sample the chart was drawn %d times in all, want 2", drawn)
	}
}
