module github.com/softefa/softefa

go 1.26
