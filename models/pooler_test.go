package models_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/models"
)

// Behind a transaction pooler, describe_exec would describe a statement on
// one server connection and execute it on another: wrong results without
// an error. Open refuses it before connecting.
func TestOpenRefusesDescribeExecBehindAPooler(t *testing.T) {
	t.Parallel()
	_, err := models.Open(context.Background(), "postgres://u@127.0.0.1:1/x?default_query_exec_mode=describe_exec",
		models.DBOptions{TransactionPooler: true})
	require.ErrorContains(t, err, "describe_exec returns wrong results behind a transaction pooler")
}
