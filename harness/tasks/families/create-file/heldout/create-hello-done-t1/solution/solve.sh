#!/bin/bash
echo done > /app/hello.txt
