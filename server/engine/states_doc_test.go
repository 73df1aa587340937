package engine

import (
	"os"
	"strings"
	"testing"
)

// docs/design.md shows the state table a reviewer checks the design
// against; it must be the one the engine enforces, row for row.
func TestDesignDocumentHasTheStateTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "\n| from | to | when | guard |\n")
	if !ok {
		t.Fatal(`docs/design.md has no table headed "| from | to | when | guard |"`)
	}
	table, _, _ = strings.Cut(table, "\n\n")
	got := tableCells(table)
	want := tableCells(stateTable())[1:] // past the header, which the Cut consumed
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("docs/design.md's state table is not the one enforced; its rows should read (cells trimmed):\n%s", strings.Join(want, "\n"))
	}
}

// tableCells gives each markdown table row as its trimmed cells joined by
// " | ", leaving out separator rows, so that padding does not count.
func tableCells(table string) []string {
	var rows []string
	for _, l := range strings.Split(strings.TrimSpace(table), "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
		for i, c := range cells {
			cells[i] = strings.TrimSpace(c)
		}
		if strings.Trim(strings.Join(cells, ""), "-") == "" {
			continue
		}
		rows = append(rows, strings.Join(cells, " | "))
	}
	return rows
}
