module github.com/valruns/valruns/client

go 1.25
