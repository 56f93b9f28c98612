package server

import (
	"bufio"
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/wire"
)

// The live view: the metrics listener also serves a page of charts of the
// daemon (/view), for an operator who wants to look rather than read. The
// daemon samples itself every second into a ring of the last five minutes;
// the page asks every two seconds for the table of groups and jobs
// (/view/data.json) and for the charts, drawn here as SVG
// (/view/chart/NAME.svg, viewchart.go), so the page needs no script
// library and no network beyond the daemon. It follows /metrics's rule
// for paths: a source is a hash of its paths unless the request presents
// the token (showPaths); the charts name jobs and devices only.

// viewSamples is how many samples the ring keeps: five minutes at the
// default second.
const viewSamples = 300

// view/ holds the page and its script, built into the binary.
//
//go:embed view
var viewFiles embed.FS

// viewSample is the daemon at one moment: counters as they were, rates
// come from two samples.
type viewSample struct {
	at      time.Time
	status  *wire.Status
	devices []job.Device
}

// viewRing holds the live view's recent samples, and the charts drawn of
// them. The zero value is an empty ring.
type viewRing struct {
	mu    sync.Mutex
	ring  []viewSample // a circle of up to viewSamples, oldest at next once full
	next  int
	added uint64            // samples added, ever: the ring's version
	names map[uint64]string // devices' names, looked up once

	// Charts are drawn once per sample, whoever asks how often: drawing
	// one costs ~40 ms of CPU at 100 jobs, growing as jobs² × samples,
	// and the page is served to anyone who can reach the port, no token
	// needed, every two seconds each. drawMu makes concurrent requests
	// wait for one drawing.
	drawMu sync.Mutex
	drawn  map[string]drawnChart
}

// drawnChart is a chart's SVG as drawn of the ring at version added.
type drawnChart struct {
	added uint64
	svg   []byte
}

// add keeps a sample, dropping the oldest once the ring is full.
func (v *viewRing) add(s viewSample) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.added++
	if len(v.ring) < viewSamples {
		v.ring = append(v.ring, s)
		return
	}
	v.ring[v.next] = s
	v.next = (v.next + 1) % viewSamples
}

// samples returns the samples oldest first, in a new slice: the samples
// themselves are never changed once kept.
func (v *viewRing) samples() []viewSample {
	all, _ := v.snapshot()
	return all
}

// snapshot is samples, and the ring's version they are of.
func (v *viewRing) snapshot() ([]viewSample, uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]viewSample, 0, len(v.ring))
	out = append(out, v.ring[v.next:]...)
	return append(out, v.ring[:v.next]...), v.added
}

// chart is chart name's SVG of the samples now: the bytes drawn for an
// earlier request if no sample came since. The caller must not change
// them.
func (v *viewRing) chart(name string, c viewChart) ([]byte, error) {
	v.drawMu.Lock()
	defer v.drawMu.Unlock()
	all, added := v.snapshot()
	if d, ok := v.drawn[name]; ok && d.added == added {
		return d.svg, nil
	}
	svg, err := c.render(all, v.deviceName)
	if err != nil {
		return nil, err
	}
	if v.drawn == nil {
		v.drawn = map[string]drawnChart{}
	}
	v.drawn[name] = drawnChart{added, svg}
	return svg, nil
}

// deviceName names a device for an operator: the block device's kernel
// name where sysfs has one ("nvme0n1"), its numbers otherwise, and the
// object store for the engine of everything that is not a local file.
func (v *viewRing) deviceName(id uint64) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if n, ok := v.names[id]; ok {
		return n
	}
	n := devName(id)
	if v.names == nil {
		v.names = map[uint64]string{}
	}
	v.names[id] = n
	return n
}

func devName(id uint64) string {
	if id == 0 {
		return "object store"
	}
	// Linux's encoding of dev_t (glibc's gnu_dev_major and gnu_dev_minor).
	major := (id>>32)&0xfffff000 | (id>>8)&0xfff
	minor := (id>>12)&0xffffff00 | id&0xff
	num := fmt.Sprintf("%d:%d", major, minor)
	f, err := os.Open("/sys/dev/block/" + num + "/uevent")
	if err != nil {
		return num
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "DEVNAME="); ok {
			return name
		}
	}
	return num
}

// sampleView samples the daemon into the view's ring every viewEvery
// until ctx ends.
func (s *Server) sampleView(ctx context.Context) error {
	t := time.NewTicker(s.viewInterval())
	defer t.Stop()
	for {
		s.view.add(viewSample{at: time.Now(), status: s.status(), devices: s.env.Devices()})
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Server) viewInterval() time.Duration {
	if s.viewEvery > 0 {
		return s.viewEvery
	}
	return time.Second
}

// viewData is /view/data.json: the daemon now, for the page's table.
type viewData struct {
	// Every is the seconds between samples; Samples how many the charts
	// draw.
	Every   float64 `json:"every"`
	Samples int     `json:"samples"`
	// Status is what riffle status shows, each source a hash of its
	// paths unless the request presented the token.
	Status *wire.Status `json:"status"`
	// Rates is each job's samples/s over the last interval, by job id
	// (Status has its rate since it opened).
	Rates   map[string]float64 `json:"rates"`
	HitRate float64            `json:"cache_hit_rate"` // percent, over the last interval
	Devices []viewDevice       `json:"devices"`
}

type viewDevice struct {
	Name     string  `json:"name"`
	MBs      float64 `json:"mb_per_sec"` // over the last interval
	InFlight int64   `json:"reads_in_flight"`
	Bytes    int64   `json:"bytes"` // read since the daemon started
}

// data describes the last sample, with the rates since the one before.
func (s *Server) viewData(full bool) viewData {
	all := s.view.samples()
	out := viewData{Every: s.viewInterval().Seconds(), Samples: len(all), Status: &wire.Status{}, Rates: map[string]float64{}}
	if len(all) == 0 {
		return out
	}
	last := all[len(all)-1]
	prev := last
	if len(all) > 1 {
		prev = all[len(all)-2]
	}
	st := *last.status
	st.Groups = slices.Clone(st.Groups)
	for i := range st.Groups {
		if !full {
			st.Groups[i].Source = s.hashPath(st.Groups[i].Source)
		}
		for _, j := range st.Groups[i].Jobs {
			if r, ok := jobRate(prev, last, j.ID); ok {
				out.Rates[j.ID] = r
			}
		}
	}
	out.Status = &st
	if h, ok := hitRate(prev, last); ok {
		out.HitRate = h
	}
	for _, d := range last.devices {
		vd := viewDevice{Name: s.view.deviceName(d.ID), InFlight: d.Stats.InFlight, Bytes: d.Stats.Bytes}
		vd.MBs, _ = deviceRate(prev, last, d.ID)
		out.Devices = append(out.Devices, vd)
	}
	return out
}

// progress is how many records a job has been given: whole epochs of its
// subset and the place in this one.
func progress(j wire.JobStatus) float64 {
	return float64(j.Epoch)*float64(j.Subset) + float64(j.Position)
}

// findJob finds a job in a sample by its id.
func findJob(s viewSample, id string) (wire.JobStatus, bool) {
	for _, g := range s.status.Groups {
		for _, j := range g.Jobs {
			if j.ID == id {
				return j, true
			}
		}
	}
	return wire.JobStatus{}, false
}

// jobRate is a job's samples/s between two samples, if it was open at both.
func jobRate(a, b viewSample, id string) (float64, bool) {
	ja, ok := findJob(a, id)
	jb, ok2 := findJob(b, id)
	dt := b.at.Sub(a.at).Seconds()
	if !ok || !ok2 || dt <= 0 {
		return 0, false
	}
	return max(0, progress(jb)-progress(ja)) / dt, true
}

// hitRate is the record cache's hit rate (percent) between two samples,
// if it was asked anything.
func hitRate(a, b viewSample) (float64, bool) {
	hits := b.status.Cache.Hits - a.status.Cache.Hits
	asked := hits + b.status.Cache.Misses - a.status.Cache.Misses
	if asked <= 0 {
		return 0, false
	}
	return 100 * float64(hits) / float64(asked), true
}

// deviceRate is a device's MB/s between two samples.
func deviceRate(a, b viewSample, id uint64) (float64, bool) {
	dt := b.at.Sub(a.at).Seconds()
	var da, db *job.Device
	for i := range a.devices {
		if a.devices[i].ID == id {
			da = &a.devices[i]
		}
	}
	for i := range b.devices {
		if b.devices[i].ID == id {
			db = &b.devices[i]
		}
	}
	if db == nil || dt <= 0 {
		return 0, false
	}
	before := int64(0) // a device first read between the two
	if da != nil {
		before = da.Stats.Bytes
	}
	return float64(max(0, db.Stats.Bytes-before)) / 1e6 / dt, true
}

// jobIDs lists the jobs of the samples, in the order they opened.
func jobIDs(all []viewSample) []string {
	seen := map[string]bool{}
	var ids []string
	for _, s := range all {
		for _, g := range s.status.Groups {
			for _, j := range g.Jobs {
				if !seen[j.ID] {
					seen[j.ID] = true
					ids = append(ids, j.ID)
				}
			}
		}
	}
	slices.SortFunc(ids, func(a, b string) int { return cmp.Or(cmp.Compare(len(a), len(b)), cmp.Compare(a, b)) })
	return ids
}

// viewRoutes adds the live view to the metrics listener's mux. Every
// route follows showPaths: a wrong token is refused, and only the table
// (data.json) names sources at all.
func (s *Server) viewRoutes(mux *http.ServeMux) {
	page, err := fs.Sub(viewFiles, "view")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	files := http.StripPrefix("/view/", http.FileServerFS(page))
	guard := func(h func(w http.ResponseWriter, r *http.Request, full bool)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			full, ok := s.showPaths(w, r)
			if !ok {
				return
			}
			w.Header().Set("Cache-Control", "no-store")
			h(w, r, full)
		}
	}
	mux.HandleFunc("GET /view", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/view/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /view/", guard(func(w http.ResponseWriter, r *http.Request, _ bool) { files.ServeHTTP(w, r) }))
	mux.HandleFunc("GET /view/data.json", guard(func(w http.ResponseWriter, r *http.Request, full bool) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s.viewData(full))
	}))
	mux.HandleFunc("GET /view/chart/{name}", guard(func(w http.ResponseWriter, r *http.Request, _ bool) {
		name, ok := strings.CutSuffix(r.PathValue("name"), ".svg")
		c, found := viewCharts[name]
		if !ok || !found {
			http.NotFound(w, r)
			return
		}
		svg, err := s.view.chart(name, c)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "image/svg+xml")
		w.Write(svg)
	}))
}
