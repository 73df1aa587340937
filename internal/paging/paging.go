// Package paging follows the API's paginated lists (ListRuns, ListWorkers,
// ListSnapshots) to their end: each request carries the previous page's
// next_page_token, the first none, and the last page has no next token.
// The clients, snapctl and the status page all list this way.
package paging

// Fetch gets the page at token ("" for the first) and returns its items
// and the next page's token ("" after the last page).
type Fetch[T any] func(token string) (items []T, next string, err error)

// Each hands each page's items to visit, in order, from the first page to
// the last; it stops at the first error.
func Each[T any](fetch Fetch[T], visit func(items []T)) error {
	token := ""
	for {
		items, next, err := fetch(token)
		if err != nil {
			return err
		}
		visit(items)
		if token = next; token == "" {
			return nil
		}
	}
}

// All returns the items of every page, in order.
func All[T any](fetch Fetch[T]) ([]T, error) {
	var all []T
	err := Each(fetch, func(items []T) { all = append(all, items...) })
	if err != nil {
		return nil, err
	}
	return all, nil
}
