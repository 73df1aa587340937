package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"regexp"
	"strconv"
	"strings"
)

// pageCheck checks one rendered page: its DOM as Chromium serialized it,
// and its screenshot.
type pageCheck func(dom string, shot image.Image) error

// pagesToCheck are the pages loaded, with what each must show.
var pagesToCheck = []struct {
	path, name, size string
	checks           []pageCheck
}{
	{"/runs/ui-check", "run", "1200,1500", []pageCheck{
		has("snapcoord run ui-check", "stopped", `id="timeline"`, `id="line-B"`, `id="line-fired"`, "save-and-stop",
			`class="snapshot saved reason-deadline"`, `class="checkpoint"`),
		lane("rank-0", "worker", "trainer rank 0"), lane("env-0", "worker", "saved"),
		decisionsNewestFirst,
	}},
	{"/runs/" + liveRun, "live", "1200,1500", []pageCheck{
		has("running", `id="flagged"`, `<td class="io-error">io_error</td>`, "ui-check: disk full", " + 3ms + "),
		lane("rank-0", "worker", "trainer rank 0"),
		lane("rank-1", "worker lagging", "BEHIND: "),
		lane("env-0", "worker", `class="cell io-error"`),
		lane("env-1", "worker silent", "SILENT: ", ">lost<"),
		decisionsNewestFirst,
		// The failed snapshot's bar on the timeline (fill #f87171) and its
		// cells in the lanes (#e53935) are drawn red: the style sheet
		// selects the class the HTML carries.
		pixels("failed snapshot bar", color.RGBA{0xf8, 0x71, 0x71, 0xff}, 100),
		pixels("failed snapshot cells", color.RGBA{0xe5, 0x39, 0x35, 0xff}, 100),
	}},
	{"/runs/" + lateRun, "late", "1200,700", []pageCheck{
		has("pending", `id="past-b"`, "PAST B by ", ": not saved"),
	}},
	{"/", "runs", "1200,500", []pageCheck{
		has("snapcoord runs", `href="/runs/ui-check"`, "stopped"),
		row("/runs/"+lateRun, `class="past-b"`, "PAST B by "),
		rowLacks("/runs/"+liveRun, "past-b"),
	}},
}

func has(want ...string) pageCheck {
	return func(dom string, _ image.Image) error {
		for _, w := range want {
			if !strings.Contains(dom, w) {
				return fmt.Errorf("the rendered page lacks %q", w)
			}
		}
		return nil
	}
}

// lane checks the named worker's row of the workers table: its classes
// exactly (flags included, none missing, none extra), and its text.
func lane(name, class string, want ...string) pageCheck {
	re := regexp.MustCompile(`(?s)<tr class="([^"]*)" data-worker="` + regexp.QuoteMeta(name) + `">(.*?)</tr>`)
	return func(dom string, _ image.Image) error {
		m := re.FindStringSubmatch(dom)
		if m == nil {
			return fmt.Errorf("no lane for worker %s in the workers table", name)
		}
		if m[1] != class {
			return fmt.Errorf("worker %s's lane has class %q, want %q: %s", name, m[1], class, m[2])
		}
		for _, w := range want {
			if !strings.Contains(m[2], w) {
				return fmt.Errorf("worker %s's lane lacks %q: %s", name, w, m[2])
			}
		}
		return nil
	}
}

// row checks the runs table's row that links to href.
func row(href string, want ...string) pageCheck {
	return func(dom string, _ image.Image) error {
		r, err := runRow(dom, href)
		if err != nil {
			return err
		}
		for _, w := range want {
			if !strings.Contains(r, w) {
				return fmt.Errorf("the row of %s lacks %q: %s", href, w, r)
			}
		}
		return nil
	}
}

func rowLacks(href, unwanted string) pageCheck {
	return func(dom string, _ image.Image) error {
		r, err := runRow(dom, href)
		if err != nil {
			return err
		}
		if strings.Contains(r, unwanted) {
			return fmt.Errorf("the row of %s has %q: %s", href, unwanted, r)
		}
		return nil
	}
}

func runRow(dom, href string) (string, error) {
	m := regexp.MustCompile(`(?s)<tr>\s*<td><a href="` + regexp.QuoteMeta(href) + `">.*?</tr>`).FindString(dom)
	if m == "" {
		return "", fmt.Errorf("no row links to %s", href)
	}
	return m, nil
}

// decisionsNewestFirst checks that the decisions table lists steps in
// decreasing order, and more than one of them.
func decisionsNewestFirst(dom string, _ image.Image) error {
	i := strings.Index(dom, `<table id="decisions">`)
	if i < 0 {
		return fmt.Errorf("no decisions table")
	}
	table := dom[i : i+strings.Index(dom[i:], "</table>")]
	var steps []int
	for _, m := range regexp.MustCompile(`<tr><td class="num">(\d+)</td>`).FindAllStringSubmatch(table, -1) {
		n, _ := strconv.Atoi(m[1])
		steps = append(steps, n)
	}
	if len(steps) < 2 {
		return fmt.Errorf("decisions table lists steps %v, want several", steps)
	}
	for k := 1; k < len(steps); k++ {
		if steps[k] >= steps[k-1] {
			return fmt.Errorf("decisions are not newest first: steps %v", steps)
		}
	}
	return nil
}

// pixels checks that at least n pixels of the screenshot have color c
// (within a small tolerance for the rasterizer).
func pixels(what string, c color.RGBA, n int) pageCheck {
	return func(_ string, shot image.Image) error {
		got := 0
		b := shot.Bounds()
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				if near(shot.At(x, y), c) {
					got++
				}
			}
		}
		if got < n {
			return fmt.Errorf("%s: %d pixels of #%02x%02x%02x in the screenshot, want at least %d", what, got, c.R, c.G, c.B, n)
		}
		return nil
	}
}

func near(p color.Color, c color.RGBA) bool {
	r, g, b, _ := p.RGBA()
	d := func(v uint32, w uint8) bool { x := int(v>>8) - int(w); return x >= -3 && x <= 3 }
	return d(r, c.R) && d(g, c.G) && d(b, c.B)
}

func decodePNG(data []byte) (image.Image, error) { return png.Decode(bytes.NewReader(data)) }
