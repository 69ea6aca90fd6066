module example.com/linuxonly

go 1.26.8
