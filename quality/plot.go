package quality

import (
	"fmt"
	"io"
	"math"

	"github.com/riffle-ml/riffle/sampler"
)

// Panel is one sampler to plot, over positions [From, To) of the epoch
// (To 0: the whole epoch). A zoom on a short range shows what the whole
// epoch hides: a block shuffle's runs of consecutive ids, a small buffer's
// locality.
type Panel struct {
	Name     string
	Sampler  sampler.Sampler
	From, To int
}

// SVG draws, for each panel, one epoch's record id (y) against its
// position (x): a full shuffle is a uniform cloud, a sequential order a
// diagonal, block shuffles short diagonal strokes. People see that faster
// than they read RL. At most maxPoints points are drawn per panel.
func SVG(w io.Writer, panels []Panel, epoch, maxPoints int) error {
	const size, pad, cols, axis = 240, 30, 2, 46
	rows := (len(panels) + cols - 1) / cols
	width, height := cols*(size+pad+axis)+pad, rows*(size+pad+20+axis)+pad
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for k, p := range panels {
		x0 := pad + axis + (k%cols)*(size+pad+axis)
		y0 := pad + (k/cols)*(size+pad+20+axis) + 14
		n := p.Sampler.Len()
		from, to := p.From, p.To
		if to <= from || to > n {
			from, to = 0, n
		}
		fmt.Fprintf(w, `<text x="%d" y="%d">%s</text>`+"\n", x0, y0-4, escape(p.Name))
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", x0, y0, size, size)
		// Axes: what each one is, in what unit, and its ends.
		fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="middle" fill="#444">position in the epoch (records)</text>`+"\n", x0+size/2, y0+size+28)
		fmt.Fprintf(w, `<text x="%d" y="%d" fill="#444">%d</text><text x="%d" y="%d" text-anchor="end" fill="#444">%d</text>`+"\n",
			x0, y0+size+14, from, x0+size, y0+size+14, to)
		fmt.Fprintf(w, `<text transform="translate(%d,%d) rotate(-90)" text-anchor="middle" fill="#444">record id</text>`+"\n", x0-30, y0+size/2)
		fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end" fill="#444">%d</text><text x="%d" y="%d" text-anchor="end" fill="#444">0</text>`+"\n",
			x0-4, y0+10, n-1, x0-4, y0+size)
		step := max(1, (to-from)/max(1, maxPoints))
		buf := make([]int, 1)
		for pos := from; pos < to; pos += step {
			p.Sampler.Fill(epoch, pos, buf)
			x := float64(x0) + float64(pos-from)/float64(to-from)*size
			y := float64(y0+size) - float64(buf[0])/float64(n)*size
			fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="0.9" fill="#1f5fbf"/>`+"\n", x, y)
		}
		if rl, ok := RL(p.Sampler); ok && from == 0 && to == n {
			fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end" fill="#444">RL %.1f%%</text>`+"\n", x0+size, y0-4, math.Round(rl*1000)/10)
		}
	}
	_, err := fmt.Fprintln(w, "</svg>")
	return err
}

func escape(s string) string {
	out := []byte{}
	for _, c := range []byte(s) {
		switch c {
		case '<':
			out = append(out, "&lt;"...)
		case '>':
			out = append(out, "&gt;"...)
		case '&':
			out = append(out, "&amp;"...)
		default:
			out = append(out, c)
		}
	}
	return string(out)
}
