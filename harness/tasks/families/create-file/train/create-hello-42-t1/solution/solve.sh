#!/bin/bash
echo 42 > /app/hello.txt
