package paging

import (
	"errors"
	"slices"
	"testing"
)

// book is a list served in pages of two, with tokens like a server's.
func book(items []string, fail string) Fetch[string] {
	return func(token string) ([]string, string, error) {
		if token == fail {
			return nil, "", errors.New("page refused")
		}
		i := 0
		if token != "" {
			i = slices.Index(items, token) + 1
		}
		end := min(i+2, len(items))
		next := ""
		if end < len(items) {
			next = items[end-1]
		}
		return items[i:end], next, nil
	}
}

func TestAllFollowsEveryPage(t *testing.T) {
	items := []string{"a", "b", "c", "d", "e"}
	got, err := All(book(items, "-"))
	if err != nil || !slices.Equal(got, items) {
		t.Fatalf("All = %v, %v; want %v", got, err, items)
	}
	var sizes []int
	if err := Each(book(items, "-"), func(p []string) { sizes = append(sizes, len(p)) }); err != nil || !slices.Equal(sizes, []int{2, 2, 1}) {
		t.Fatalf("Each: pages of %v, %v; want [2 2 1]", sizes, err)
	}
}

func TestAllStopsAtAnError(t *testing.T) {
	got, err := All(book([]string{"a", "b", "c", "d", "e"}, "d"))
	if err == nil || got != nil {
		t.Fatalf("All = %v, %v; want the third page's error and nothing", got, err)
	}
}
